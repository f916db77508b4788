//! The byte formats Velero uploads: gzip streams and the ustar tarball of resource manifests.
//! The tarball is written by hand (no tar crate in the dependency set); ustar is simple and any
//! `tar` reads it.

use std::io::Write;

use flate2::Compression;
use flate2::write::GzEncoder;

/// Gzip-compresses `data`.
pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    // Writing into a Vec cannot fail.
    let _ = enc.write_all(data);
    enc.finish().unwrap_or_default()
}

fn octal(field: &mut [u8], value: u64) {
    // Width minus the terminating NUL, zero padded.
    let width = field.len() - 1;
    let s = format!("{value:0width$o}");
    let bytes = s.as_bytes();
    let start = bytes.len().saturating_sub(width);
    field[..width].copy_from_slice(&bytes[start..]);
    field[width] = 0;
}

/// One ustar header block for a regular file. Paths over 100 bytes use the 155-byte prefix field.
fn header(path: &str, size: u64, mtime: u64) -> [u8; 512] {
    let mut h = [0u8; 512];
    let (prefix, name) = if path.len() <= 100 {
        ("", path)
    } else {
        // Split at a '/' so that the name part fits; Velero's paths are short enough for this.
        let cut = path[..path.len().min(155)].rfind('/').unwrap_or(0);
        (&path[..cut], &path[cut + 1..])
    };
    let name = &name.as_bytes()[..name.len().min(100)];
    h[..name.len()].copy_from_slice(name);
    octal(&mut h[100..108], 0o644);
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], mtime);
    h[148..156].copy_from_slice(b"        ");
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    let prefix = &prefix.as_bytes()[..prefix.len().min(155)];
    h[345..345 + prefix.len()].copy_from_slice(prefix);
    let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
    let s = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(s.as_bytes());
    h
}

/// A gzip'd ustar archive of `(path, content)` entries.
pub fn tar_gz(entries: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mtime = jiff::Timestamp::now().as_second().max(0) as u64;
    let mut out = Vec::new();
    for (path, data) in entries {
        out.extend_from_slice(&header(path, data.len() as u64, mtime));
        out.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        out.extend(std::iter::repeat_n(0u8, pad));
    }
    // Two zero blocks end the archive.
    out.extend(std::iter::repeat_n(0u8, 1024));
    gzip(&out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::read::GzDecoder;
    use std::io::Read;

    #[test]
    fn tarball_round_trips_through_gzip_and_has_valid_headers() {
        let long = format!("resources/pods/namespaces/{}/pg-0.json", "n".repeat(90));
        let gz = tar_gz(&[
            ("a.json".into(), b"{}".to_vec()),
            (long.clone(), b"[1]".to_vec()),
        ]);
        let mut raw = Vec::new();
        GzDecoder::new(&gz[..]).read_to_end(&mut raw).unwrap();
        assert_eq!(raw.len() % 512, 0);
        assert_eq!(&raw[..6], b"a.json");
        assert_eq!(&raw[257..262], b"ustar");
        // Checksum: the sum of the header with the checksum field read as spaces.
        let mut h = raw[..512].to_vec();
        let stored = u64::from_str_radix(std::str::from_utf8(&h[148..154]).unwrap(), 8).unwrap();
        h[148..156].copy_from_slice(b"        ");
        assert_eq!(stored, h.iter().map(|&b| u64::from(b)).sum::<u64>());
        assert_eq!(&raw[512..514], b"{}");
        // The long path is split into prefix and name.
        let second = &raw[1024..1536];
        let prefix = std::str::from_utf8(&second[345..500])
            .unwrap()
            .trim_end_matches('\0');
        let name = std::str::from_utf8(&second[..100])
            .unwrap()
            .trim_end_matches('\0');
        assert_eq!(format!("{prefix}/{name}"), long);
    }
}
