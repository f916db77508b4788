//! Puts the git revision into `snapdrain --version` (environment variable `SNAPDRAIN_REVISION` at
//! compile time): the commit of this checkout, or `unknown` without `.git`.

#[path = "build/revision.rs"]
mod revision;

use std::path::PathBuf;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=build/revision.rs");
    println!("cargo::rerun-if-env-changed=SNAPDRAIN_REVISION");
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let overridden = std::env::var("SNAPDRAIN_REVISION").ok();
    let (rev, files) = revision::revision(&dir, overridden.as_deref());
    for f in files {
        println!("cargo::rerun-if-changed={}", f.display());
    }
    println!("cargo::rustc-env=SNAPDRAIN_REVISION={rev}");
}
