//! Booleans in BackupStorageLocation config as velero-plugin-for-aws reads them: Go's
//! `strconv.ParseBool` (`object_store.go` `Init` for `s3ForcePathStyle` and `insecureSkipTLSVerify`).

/// Go's `strconv.ParseBool`: `1 t T TRUE true True` and `0 f F FALSE false False`; anything else is not a
/// boolean (the plugin refuses the location, and so does snapdrain).
pub fn parse_go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_exactly_what_go_accepts() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_go_bool(t), Some(true), "{t}");
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_go_bool(f), Some(false), "{f}");
        }
        for bad in ["", "yes", "on", "tRuE", " true", "true ", "2", "FaLsE", "y"] {
            assert_eq!(parse_go_bool(bad), None, "{bad:?}");
        }
    }
}
