//! `snapdrain demo` end to end, in-process: the same library function the CLI calls, writing into a buffer
//! this test reads. Fast timings keep it short; the story and the checks are the same.

use std::time::Duration;

use snapdrain::api::status::PlanPhase;
use snapdrain_cli::demo::{DemoOptions, run};
use snapdrain_testkit::fast_timings;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn demo_completes_with_a_verified_backup_a_ready_replacement_and_a_clean_audit() {
    let opts = DemoOptions {
        timings: Some(fast_timings()),
        timeout: Duration::from_secs(60),
        ..DemoOptions::default()
    };
    let mut out: Vec<u8> = Vec::new();
    let demo = run(&opts, &mut out).await.expect("the demo runs");
    let text = String::from_utf8_lossy(&out).to_string();
    let report = demo.report.clone();

    assert_eq!(demo.failure(), None, "{text}");
    assert_eq!(report.phase, Some(PlanPhase::Completed), "{text}");
    assert!(report.violations.is_empty(), "{:?}", report.violations);

    let verified: Vec<_> = report.backups.iter().filter(|b| b.verified).collect();
    assert!(!verified.is_empty(), "no verified backup: {text}");
    for b in &verified {
        assert!(
            text.contains(&format!("{} (Completed, verified", b.name)),
            "the summary does not name verified backup {}: {text}",
            b.name
        );
        assert!(
            !b.objects.is_empty(),
            "backup {} lists no bucket objects",
            b.name
        );
    }
    assert!(
        report.evicted.iter().any(|(_, protected)| *protected),
        "no protected pod was evicted: {text}"
    );

    let replacement = report.replacement.as_ref().expect("a replacement");
    assert!(replacement.ready, "{text}");
    let node = replacement.node_name.as_deref().expect("replacement node");
    assert!(
        text.contains(&format!("→ node {node} (Ready)")),
        "the summary does not name replacement node {node}: {text}"
    );
    assert!(
        replacement
            .sysctls
            .iter()
            .any(|(k, v)| k == "fs.inotify.max_user_watches" && v == "524288"),
        "{replacement:?}"
    );
    assert!(
        replacement
            .taints
            .iter()
            .any(|t| t == "example.com/dedicated=db:NoSchedule")
    );
    assert!(
        report
            .instance
            .as_ref()
            .is_some_and(|(_, state)| state == "terminated"),
        "{:?}",
        report.instance
    );
    assert!(text.contains("safety check    PASSED"), "{text}");
    // Plain output (no terminal): no spinner escape sequences in the text.
    assert!(!text.contains('\u{1b}'), "{text}");
    demo.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unknown_node_is_refused_with_the_names_to_pick_from() {
    let opts = DemoOptions {
        node: Some("no-such-node".into()),
        timings: Some(fast_timings()),
        ..DemoOptions::default()
    };
    let mut out: Vec<u8> = Vec::new();
    let err = match run(&opts, &mut out).await {
        Ok(_) => panic!("a demo on a missing node must fail"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("no node no-such-node") && err.contains("pick one of"),
        "{err}"
    );
}
