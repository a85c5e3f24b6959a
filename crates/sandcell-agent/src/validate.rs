//! Validation-aware runs: when the model gives its final answer, the run's command runs in
//! its sandbox. Exit 0 ends the run `validated`; anything else goes back to the model (the
//! exit code and the output's tail), until the attempts are spent (`validation_failed`).

use std::time::Instant;

use sandcell_api::exec::ExecInput;
use sandcell_api::runs::Validate;
use sandcell_api::{SandboxId, Timeout};
use sandcell_service::{Caller, Service, ServiceError};

use tokio_util::sync::CancellationToken;

use crate::event::EventKind;
use crate::run::Ended;

/// Characters of the command's output the model reads back.
pub const OUTPUT_TAIL_CHARS: usize = 4_000;

/// What a check of an answer came to.
#[derive(Debug)]
pub enum Verdict {
    /// The command passed: the run ends `validated` with the answer.
    Passed,
    /// It failed and the model may try again: tell it this.
    Retry(String),
    /// It failed and no attempt is left: the run ends `validation_failed`.
    Failed,
}

/// The last `max` characters of `text`, marked when cut.
fn tail(text: &str, max: usize) -> String {
    let count = text.chars().count();
    if count <= max {
        return text.to_string();
    }
    let start = text.char_indices().nth(count - max).map_or(0, |(i, _)| i);
    format!("[… {} characters cut]\n{}", count - max, &text[start..])
}

/// Runs `v`'s command in the sandbox for answer number `attempt`; the verdict and the
/// `validation` event that records it. A command that cannot be started at all (the
/// sandbox is gone) is the run's error, not a failed check.
pub async fn check(
    service: &Service,
    caller: &Caller,
    sandbox: &SandboxId,
    v: &Validate,
    attempt: u32,
) -> Result<(Verdict, EventKind), ServiceError> {
    let started = Instant::now();
    let input = ExecInput {
        cmd: Some(v.command.clone()),
        timeout_secs: Some(Timeout::from_secs(v.timeout_secs())?),
        ..ExecInput::default()
    };
    let out = service.exec(caller, sandbox, input).await?;
    let mut output = out.stdout.clone();
    if !out.stderr.is_empty() {
        if !output.is_empty() && !output.ends_with('\n') {
            output.push('\n');
        }
        output.push_str(&out.stderr);
    }
    let output_tail = tail(&output, OUTPUT_TAIL_CHARS);
    let max_attempts = v.attempts();
    let verdict = if out.ok {
        Verdict::Passed
    } else if attempt < max_attempts {
        let how = match out.exit_code {
            Some(code) => format!("exited with code {code}"),
            None => format!("ended: {}", out.result.message),
        };
        Verdict::Retry(format!(
            "Your answer was checked by running `{}` in the sandbox, and the check failed \
             (attempt {attempt} of {max_attempts}): it {how}.\nIts output ends with:\n{}\n\
             Fix the problem, then give your final answer again.",
            v.command,
            if output_tail.trim().is_empty() {
                "(no output)"
            } else {
                output_tail.trim_end()
            }
        ))
    } else {
        Verdict::Failed
    };
    let event = EventKind::Validation {
        attempt,
        max_attempts,
        command: v.command.clone(),
        passed: out.ok,
        exit_code: out.exit_code,
        cause: out.result.cause.clone(),
        output_tail,
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    };
    Ok((verdict, event))
}

/// An answer the model gave, and how it is to be checked.
pub struct Given<'a> {
    /// The run's check (none: the answer is taken as given).
    pub validate: Option<&'a Validate>,
    /// The run's sandbox.
    pub sandbox: &'a SandboxId,
    /// The run's reason to end without a check (`final`, `text`, `forced`).
    pub reason: &'a str,
    /// The answer.
    pub answer: &'a str,
}

/// The model gave an answer: how the run ends, or what the model is told (`Err`) when the
/// check failed with attempts left. `attempts` counts the answers checked so far; the
/// `validation` event goes to `emit`.
pub async fn answer_given(
    service: &Service,
    caller: &Caller,
    cancel: &CancellationToken,
    given: Given<'_>,
    attempts: &mut u32,
    emit: impl FnOnce(EventKind) -> Result<(), ServiceError>,
) -> Result<Result<Ended, String>, ServiceError> {
    let answer = given.answer.to_string();
    let Some(v) = given.validate else {
        return Ok(Ok(Ended::succeeded(given.reason, answer)));
    };
    *attempts += 1;
    let (verdict, event) = tokio::select! {
        () = cancel.cancelled() => return Ok(Ok(Ended::cancelled())),
        c = check(service, caller, given.sandbox, v, *attempts) => c?,
    };
    emit(event)?;
    Ok(match verdict {
        Verdict::Retry(feedback) => Err(feedback),
        Verdict::Passed => Ok(Ended::succeeded("validated", answer)),
        Verdict::Failed => Ok(Ended::validation_failed(answer)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_output_keeps_its_end_and_says_what_was_cut() {
        let text = format!("{}END", "x".repeat(10_000));
        let t = tail(&text, 100);
        assert!(t.ends_with("END"));
        assert!(t.starts_with("[… 9903 characters cut]"), "{t}");
        assert_eq!(tail("short", 100), "short");
    }
}
