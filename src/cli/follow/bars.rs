//! Progress bars on a terminal: a header (the step, elapsed time, the deadline), one bar per Velero
//! Backup (items, and bytes of volume data when PodVolumeBackups report them) and one per node (pods
//! evicted of total, who is blocked and why). Drawn on stderr; lines go to stdout around them.

use std::collections::BTreeMap;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::events::{Update, human_bytes};

pub struct Bars {
    multi: MultiProgress,
    header: ProgressBar,
    backups: BTreeMap<String, ProgressBar>,
    nodes: BTreeMap<String, ProgressBar>,
    /// Bytes text per backup, shown after its items.
    bytes: BTreeMap<String, String>,
}

fn style(template: &str) -> ProgressStyle {
    // The templates are constants checked by the unit test below; fall back to the default style rather
    // than fail the command over a cosmetic problem.
    ProgressStyle::with_template(template)
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
}

const HEADER: &str = "{spinner:.cyan} {elapsed:>4} {msg}";
const BACKUP: &str = "  backup {prefix:.bold} [{bar:25.cyan/blue}] {pos}/{len} items {msg}";
const NODE: &str =
    "  node {prefix:.bold} [{bar:25.green/blue}] {pos}/{len} pods evicted {msg:.yellow}";

impl Default for Bars {
    fn default() -> Self {
        Self::new()
    }
}

impl Bars {
    pub fn new() -> Self {
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
        let header = multi.add(ProgressBar::new_spinner());
        header.set_style(style(HEADER));
        header.enable_steady_tick(Duration::from_millis(120));
        Self {
            multi,
            header,
            backups: BTreeMap::new(),
            nodes: BTreeMap::new(),
            bytes: BTreeMap::new(),
        }
    }

    pub fn header(&mut self, text: String) {
        self.header.set_message(text);
    }

    fn backup_bar(&mut self, name: &str) -> &ProgressBar {
        let multi = &self.multi;
        self.backups.entry(name.to_string()).or_insert_with(|| {
            let pb = multi.add(ProgressBar::new(0));
            pb.set_style(style(BACKUP));
            pb.set_prefix(name.to_string());
            pb
        })
    }

    fn node_bar(&mut self, node: &str) -> &ProgressBar {
        let multi = &self.multi;
        self.nodes.entry(node.to_string()).or_insert_with(|| {
            let pb = multi.add(ProgressBar::new(0));
            pb.set_style(style(NODE));
            pb.set_prefix(node.to_string());
            pb
        })
    }

    pub fn apply(&mut self, u: &Update) {
        match u {
            Update::BackupCreated { name, .. } => {
                self.backup_bar(name).set_message("created");
            }
            Update::BackupPhase { name, phase } => {
                let bytes = self.bytes.get(name).cloned().unwrap_or_default();
                self.backup_bar(name)
                    .set_message(format!("{phase} {bytes}"));
            }
            Update::BackupItems { name, done, total } => {
                let pb = self.backup_bar(name);
                pb.set_length(*total);
                pb.set_position(*done);
            }
            Update::BackupBytes { name, done, total } => {
                let text = format!("({} / {})", human_bytes(*done), human_bytes(*total));
                self.bytes.insert(name.clone(), text.clone());
                self.backup_bar(name).set_message(text);
            }
            Update::BackupVerified { name, bytes, .. } => {
                let pb = self.backup_bar(name);
                if pb.length().unwrap_or(0) == 0 {
                    pb.set_length(1);
                }
                pb.set_position(pb.length().unwrap_or(1));
                pb.finish_with_message(format!("verified ({} in the bucket)", human_bytes(*bytes)));
            }
            Update::VerificationFailed { name, .. } => {
                self.backup_bar(name)
                    .abandon_with_message("verification failed");
            }
            Update::Evictions {
                node,
                evicted,
                total,
            } => {
                let pb = self.node_bar(node);
                pb.set_length(u64::from(*total));
                pb.set_position(u64::from(*evicted));
            }
            Update::Blocked { node, pods, why } => {
                self.node_bar(node)
                    .set_message(format!("{pods} blocked: {}", shorten(why, 90)));
            }
            Update::Unblocked { node } => self.node_bar(node).set_message(""),
            _ => {}
        }
    }

    /// Hides the bars (while a question waits on the terminal: a redraw would overwrite it).
    pub fn pause(&self) {
        // Clearing can only fail when the terminal went away.
        let _ = self.multi.clear();
        self.multi.set_draw_target(ProgressDrawTarget::hidden());
    }

    pub fn resume(&self) {
        self.multi.set_draw_target(ProgressDrawTarget::stderr());
    }

    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.multi.suspend(f)
    }

    pub fn clear(self) {
        for pb in self.backups.values().chain(self.nodes.values()) {
            pb.finish_and_clear();
        }
        self.header.finish_and_clear();
        // Clearing can only fail when the terminal went away; nothing is left to tidy then.
        let _ = self.multi.clear();
    }
}

/// Cuts `s` to `max` characters with an ellipsis (a bar must fit on one line).
fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let cut: String = s.chars().take(max.saturating_sub(1)).collect();
    format!("{cut}…")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_valid() {
        for t in [HEADER, BACKUP, NODE] {
            assert!(ProgressStyle::with_template(t).is_ok(), "{t}");
        }
    }

    #[test]
    fn long_reasons_are_shortened() {
        assert_eq!(shorten("abc", 5), "abc");
        assert_eq!(shorten("abcdefgh", 5), "abcd…");
    }
}
