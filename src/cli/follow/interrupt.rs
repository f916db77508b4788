//! What Ctrl-C means while a plan is followed: on a terminal, a question (abort and roll back, leave the
//! plan running, or keep following); without one, the plan is left running and the way to abort is told.

/// The person's answer to the Ctrl-C question.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// Set `snapdrain.io/abort: "true"` and follow the rollback to Aborted.
    Abort,
    /// Exit; the controller carries on with the plan.
    Leave,
    /// Ignore the Ctrl-C.
    Continue,
}

pub fn prompt(plan: &str) -> String {
    format!(
        "\nCtrl-C: what about plan {plan}?\n  [a] abort it: stop and roll back (uncordon, restore holds)\n  [l] leave it running and exit (default)\n  [c] continue following\nchoice [a/l/c]: "
    )
}

/// Reads an answer; anything unclear (including an empty line or end of input) leaves the plan running,
/// the choice that changes nothing.
pub fn parse_choice(answer: &str) -> Choice {
    match answer.trim().to_ascii_lowercase().as_str() {
        "a" | "abort" | "y" | "yes" => Choice::Abort,
        "c" | "continue" => Choice::Continue,
        _ => Choice::Leave,
    }
}

/// What to tell when the plan is left running.
pub fn left_running_hint(program: &str, plan: &str) -> String {
    format!(
        "plan {plan} keeps running in the cluster. Follow it: {program} status {plan}; abort it (rolls back): {program} abort {plan}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_clear_answer_aborts() {
        assert_eq!(parse_choice("a\n"), Choice::Abort);
        assert_eq!(parse_choice(" Abort "), Choice::Abort);
        assert_eq!(parse_choice("c"), Choice::Continue);
        assert_eq!(parse_choice(""), Choice::Leave);
        assert_eq!(parse_choice("l"), Choice::Leave);
        assert_eq!(parse_choice("maybe"), Choice::Leave);
    }

    #[test]
    fn the_hint_names_both_commands() {
        let h = left_running_hint("kubectl snapdrain", "p1");
        assert!(
            h.contains("kubectl snapdrain status p1") && h.contains("kubectl snapdrain abort p1")
        );
    }
}
