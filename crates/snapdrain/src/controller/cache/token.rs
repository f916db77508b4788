//! The API's opaque strings that are almost always a UUID (`metadata.uid`) or a decimal number
//! (`metadata.resourceVersion`, etcd's revision), kept in 24 bytes inline instead of a heap string of
//! 36 or 8 bytes per object. They are opaque to clients (API conventions, "Concurrency Control and
//! Consistency"), so anything else is kept as it came, and every form gives back exactly the text it
//! was made from.

use std::borrow::Cow;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Token {
    /// A lowercase hyphenated UUID (how the API server writes uids).
    Uuid(uuid::Uuid),
    /// A decimal number without leading zeros.
    Number(u64),
    Text(Box<str>),
}

impl Token {
    pub fn new(s: &str) -> Self {
        if let Ok(n) = s.parse::<u64>()
            && n.to_string() == s
        {
            return Self::Number(n);
        }
        if s.len() == 36
            && let Ok(u) = uuid::Uuid::try_parse(s)
            && u.hyphenated().to_string() == s
        {
            return Self::Uuid(u);
        }
        Self::Text(s.into())
    }

    pub fn as_str(&self) -> Cow<'_, str> {
        match self {
            Self::Uuid(u) => Cow::Owned(u.hyphenated().to_string()),
            Self::Number(n) => Cow::Owned(n.to_string()),
            Self::Text(s) => Cow::Borrowed(s),
        }
    }

    /// Whether this is the token made from `s`, without rendering it.
    pub fn is(&self, s: &str) -> bool {
        match self {
            Self::Text(t) => **t == *s,
            _ => *self == Self::new(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_gives_back_the_text_it_was_made_from() {
        for s in [
            "5f1c2a9e-3b7d-4c1e-9a2f-0d6b8e4c7a13",
            "5F1C2A9E-3B7D-4C1E-9A2F-0D6B8E4C7A13",
            "5f1c2a9e3b7d4c1e9a2f0d6b8e4c7a13",
            "123456789",
            "0",
            "007",
            "18446744073709551616",
            "-1",
            "u1",
            "",
        ] {
            let t = Token::new(s);
            assert_eq!(t.as_str(), s, "{t:?}");
            assert!(t.is(s));
        }
        assert!(matches!(
            Token::new("5f1c2a9e-3b7d-4c1e-9a2f-0d6b8e4c7a13"),
            Token::Uuid(_)
        ));
        assert!(matches!(Token::new("123456789"), Token::Number(_)));
        assert!(matches!(Token::new("007"), Token::Text(_)));
        assert!(!Token::new("12").is("012"));
        assert_eq!(std::mem::size_of::<Token>(), 24);
    }
}
