//! `snapdrain completion bash|zsh|fish` and `snapdrain man`, generated from the clap definitions so they
//! never drift from the real flags.

use std::io::Write;

use clap::{Args, CommandFactory, ValueEnum};
use clap_complete::Shell;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ShellArg {
    Bash,
    Zsh,
    Fish,
}

#[derive(Debug, Args)]
pub struct CompletionArgs {
    /// The shell to complete for.
    pub shell: ShellArg,
}

/// The completion script for `shell`, for a binary called `bin`.
pub fn completion_script(shell: ShellArg, bin: &str) -> Vec<u8> {
    let shell = match shell {
        ShellArg::Bash => Shell::Bash,
        ShellArg::Zsh => Shell::Zsh,
        ShellArg::Fish => Shell::Fish,
    };
    let mut cmd = super::Cli::command();
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut cmd, bin, &mut buf);
    buf
}

/// The man page (roff) of the whole command line, its subcommands included.
pub fn man_page() -> std::io::Result<Vec<u8>> {
    let cmd = super::Cli::command();
    let mut buf = Vec::new();
    let man = clap_mangen::Man::new(cmd.clone());
    man.render(&mut buf)?;
    // clap_mangen renders one command per page; the user-facing subcommands follow as sections, so that
    // `man snapdrain` alone documents drain, status, abort and report with their flags.
    for sub in cmd.get_subcommands() {
        if sub.is_hide_set() {
            continue;
        }
        let name = sub.get_name();
        let mut page = Vec::new();
        let sub_man = clap_mangen::Man::new(sub.clone());
        sub_man.render_description_section(&mut page)?;
        sub_man.render_options_section(&mut page)?;
        sub_man.render_extra_section(&mut page)?;
        writeln!(buf, ".SH \"SNAPDRAIN {}\"", name.to_uppercase())?;
        writeln!(
            buf,
            "snapdrain {name} \\- {}",
            sub.get_about().map(|a| a.to_string()).unwrap_or_default()
        )?;
        // Each rendered section starts with its own .SH; demote them so they nest under this command.
        let text = String::from_utf8_lossy(&page).replace(".SH ", ".SS ");
        buf.extend_from_slice(text.as_bytes());
    }
    Ok(buf)
}

pub fn run_completion(args: CompletionArgs) -> anyhow::Result<()> {
    let script = completion_script(args.shell, "snapdrain");
    std::io::stdout().write_all(&script)?;
    Ok(())
}

pub fn run_man() -> anyhow::Result<()> {
    std::io::stdout().write_all(&man_page()?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_know_the_drain_flags() {
        for shell in [ShellArg::Bash, ShellArg::Zsh, ShellArg::Fish] {
            let s = String::from_utf8(completion_script(shell, "snapdrain")).expect("utf8");
            assert!(s.contains("drain"), "{shell:?}");
            assert!(
                s.contains("wait-timeout"),
                "{shell:?} completes drain's flags"
            );
        }
    }

    #[test]
    fn the_man_page_documents_the_subcommands_and_their_flags() {
        let page = String::from_utf8(man_page().expect("renders")).expect("utf8");
        assert!(
            page.starts_with(".ie") || page.contains(".TH snapdrain"),
            "roff header"
        );
        assert!(page.contains(".SH \"SNAPDRAIN DRAIN\""), "drain section");
        assert!(page.contains("wait\\-timeout"), "drain flags rendered");
        assert!(page.contains("Exit codes"), "exit codes documented");
    }
}
