//! Response documents in the shape aws-sdk-ec2 parses: `<ActionResponse xmlns=…>` with
//! camelCase members and `<item>` list entries, and EC2's `<Response><Errors>` error envelope.

pub(super) const NAMESPACE: &str = "http://ec2.amazonaws.com/doc/2016-11-15/";

/// A small XML writer; every text value is escaped.
pub(super) struct Xml(String);

impl Xml {
    pub(super) fn response(action: &str, request_id: &str) -> Xml {
        let mut x = Xml(format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<{action}Response xmlns=\"{NAMESPACE}\">"
        ));
        x.leaf("requestId", request_id);
        x
    }

    pub(super) fn open(&mut self, tag: &str) -> &mut Self {
        self.0.push('<');
        self.0.push_str(tag);
        self.0.push('>');
        self
    }

    pub(super) fn close(&mut self, tag: &str) -> &mut Self {
        self.0.push_str("</");
        self.0.push_str(tag);
        self.0.push('>');
        self
    }

    pub(super) fn leaf(&mut self, tag: &str, value: impl AsRef<str>) -> &mut Self {
        self.open(tag);
        self.0.push_str(&escape(value.as_ref()));
        self.close(tag)
    }

    pub(super) fn opt(&mut self, tag: &str, value: Option<impl AsRef<str>>) -> &mut Self {
        if let Some(v) = value {
            self.leaf(tag, v);
        }
        self
    }

    pub(super) fn finish(mut self, action: &str) -> String {
        self.close(&format!("{action}Response"));
        self.0
    }
}

pub(super) fn error_document(code: &str, message: &str, request_id: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{}</Code><Message>{}</Message></Error></Errors><RequestID>{}</RequestID></Response>",
        escape(code),
        escape(message),
        escape(request_id)
    )
}

pub(super) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}
