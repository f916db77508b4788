//! The git revision `snapdrain --version` prints, found by the build script (build.rs). Kept apart so
//! that unit tests run the same code on a repository they make and on a directory without one.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What is printed when the revision cannot be known: a source archive without `.git`, no git installed.
pub const UNKNOWN: &str = "unknown";

/// The revision of the checkout at `dir`, and the files whose change moves it (for
/// `cargo::rerun-if-changed`). `overridden` (the `SNAPDRAIN_REVISION` variable) wins: a build from an
/// exported tree can still name its commit.
pub fn revision(dir: &Path, overridden: Option<&str>) -> (String, Vec<PathBuf>) {
    if let Some(r) = overridden.map(str::trim).filter(|r| !r.is_empty()) {
        return (r.to_string(), Vec::new());
    }
    match from_git(dir) {
        Some(found) => found,
        None => (UNKNOWN.to_string(), Vec::new()),
    }
}

fn from_git(dir: &Path) -> Option<(String, Vec<PathBuf>)> {
    // Only this checkout's own repository: a source archive unpacked inside some other repository
    // must not print that repository's commit.
    let top = git(dir, &["rev-parse", "--show-toplevel"])?;
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if !same(Path::new(&top), dir) {
        return None;
    }
    let head = git(dir, &["rev-parse", "--verify", "--quiet", "HEAD"])?;
    // HEAD names the branch; the branch's ref file (or packed-refs) holds the commit. In a worktree these
    // live in different directories, which `--git-path` resolves.
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(branch) = git(dir, &["symbolic-ref", "--quiet", "HEAD"]) {
        watched.push(branch);
    }
    let files = watched
        .iter()
        .filter_map(|p| {
            git(
                dir,
                &["rev-parse", "--path-format=absolute", "--git-path", p],
            )
        })
        .map(PathBuf::from)
        // A file that does not exist would make cargo run the build script on every build.
        .filter(|p| p.is_file())
        .collect();
    Some((head, files))
}

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        // The caller's GIT_DIR (a git hook, a script) would point at another repository.
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    Some(text.trim().to_string()).filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_git(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
            .args([
                "-c",
                "commit.gpgsign=false",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .current_dir(dir)
            .env_remove("GIT_DIR")
            .env_remove("GIT_WORK_TREE")
            .output()
            .expect("git runs (the tests make a repository)");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    #[test]
    fn a_checkout_gives_its_head_commit_and_the_files_that_move_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        run_git(dir.path(), &["init", "-q"]);
        std::fs::write(dir.path().join("a"), "a").expect("write");
        run_git(dir.path(), &["add", "a"]);
        run_git(dir.path(), &["commit", "-q", "-m", "one"]);
        let head = run_git(dir.path(), &["rev-parse", "HEAD"]);
        let (rev, files) = revision(dir.path(), None);
        assert_eq!(rev, head);
        assert_eq!(rev.len(), 40, "the full commit id: {rev}");
        let git_dir = dir
            .path()
            .join(".git")
            .canonicalize()
            .expect("the .git dir");
        let names: Vec<_> = files
            .iter()
            .map(|f| f.strip_prefix(&git_dir).unwrap_or(f).to_path_buf())
            .collect();
        assert!(
            names.contains(&PathBuf::from("HEAD"))
                && names.contains(&PathBuf::from("refs/heads/main")),
            "{files:?}"
        );
    }

    #[test]
    fn without_git_metadata_the_revision_is_unknown() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(revision(dir.path(), None), (UNKNOWN.to_string(), vec![]));
        // Unpacked inside another repository: that repository's commit is not ours.
        run_git(dir.path(), &["init", "-q"]);
        std::fs::write(dir.path().join("a"), "a").expect("write");
        run_git(dir.path(), &["add", "a"]);
        run_git(dir.path(), &["commit", "-q", "-m", "one"]);
        let inner = dir.path().join("snapdrain-0.1.0");
        std::fs::create_dir(&inner).expect("mkdir");
        assert_eq!(revision(&inner, None).0, UNKNOWN);
    }

    #[test]
    fn the_environment_names_the_revision_of_an_exported_tree() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(revision(dir.path(), Some(" abc123\n")).0, "abc123");
        assert_eq!(revision(dir.path(), Some("")).0, UNKNOWN);
    }
}
