//! `snapdrain report PLAN -o report.html`: what happened to a plan, as one self-contained HTML page or
//! as Markdown for a change record.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, ValueEnum};

use super::cluster::ClusterArgs;
use crate::report::{gather, render_html, render_markdown};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ReportFormat {
    Html,
    Markdown,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The DisruptionPlan to report on (finished or still running).
    pub plan: String,
    /// Write the report to this file (default: stdout).
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// HTML (default, or when FILE ends in .html) or Markdown (default when FILE ends in .md).
    #[arg(long, value_enum)]
    pub format: Option<ReportFormat>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// The format asked for, else the one the file name suggests, else HTML.
pub fn format_for(
    explicit: Option<ReportFormat>,
    output: Option<&std::path::Path>,
) -> ReportFormat {
    explicit.unwrap_or_else(
        || match output.and_then(|p| p.extension()).and_then(|e| e.to_str()) {
            Some("md" | "markdown") => ReportFormat::Markdown,
            _ => ReportFormat::Html,
        },
    )
}

pub async fn run(args: ReportArgs) -> anyhow::Result<()> {
    let client = args.cluster.client().await?;
    let data = gather(&client, &args.plan).await?;
    let text = match format_for(args.format, args.output.as_deref()) {
        ReportFormat::Html => render_html(&data),
        ReportFormat::Markdown => render_markdown(&data),
    };
    match &args.output {
        Some(path) => {
            std::fs::write(path, text)
                .with_context(|| format!("cannot write the report to {}", path.display()))?;
            println!(
                "report for plan {} written to {}",
                args.plan,
                path.display()
            );
        }
        None => print!("{text}"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_file_name_picks_the_format_unless_told() {
        assert!(matches!(
            format_for(None, Some(Path::new("r.md"))),
            ReportFormat::Markdown
        ));
        assert!(matches!(
            format_for(None, Some(Path::new("r.html"))),
            ReportFormat::Html
        ));
        assert!(matches!(format_for(None, None), ReportFormat::Html));
        assert!(matches!(
            format_for(Some(ReportFormat::Markdown), Some(Path::new("r.html"))),
            ReportFormat::Markdown
        ));
    }
}
