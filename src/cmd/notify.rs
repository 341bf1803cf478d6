//! Telling the owner, once a run has recorded what it found: the message (or reminder, or
//! all-clear) the library decides on, through the channels the settings name, and the
//! heartbeat after a clean run; `intact notify --test` proves the channels reach a person.

use std::path::PathBuf;

use crate::cli::NotifyTestArgs;
use crate::cli::settings::{setup, usage};
use intact::notify::{self, Context, Decision, Findings, Problem, Setup, Told};
use intact::report::Exit;
use intact::state::{self, State};

/// What a run tells the owner about.
pub(super) struct Run<'a> {
    /// Its verb.
    pub verb: &'a str,
    /// The trees it ran over.
    pub roots: &'a [PathBuf],
    /// What it found wrong.
    pub findings: &'a Findings,
    /// Whether it was stopped before it finished.
    pub interrupted: bool,
    /// Its exit code.
    pub exit: Exit,
    /// It sees part of the trees only (`watch`, which sees what is written): it only tells
    /// what is new: no reminder, no all-clear, no heartbeat, and what it told is added to what
    /// the owner was told before rather than put in its place.
    pub partial: bool,
}

/// Tells the owner what `run` found, as `setup` says: an alarm when something is new, a
/// reminder when one is due, one all-clear after an alarm; then, after a clean run, the
/// heartbeat. What was told is remembered in `state`, once delivered (a failed delivery is
/// tried again by the next run). Returns what failed, for the run to report.
pub(super) fn tell(setup: &Setup, run: &Run<'_>, state: Option<&mut State>) -> Vec<String> {
    let Run {
        verb,
        roots,
        findings,
        interrupted,
        exit,
        partial,
    } = *run;
    let mut failed = Vec::new();
    let now = state::now();
    let mut found = findings.clone();
    if interrupted {
        found.push(Problem::Interrupted);
    }
    if !setup.channels.is_empty() {
        let mut keys = found.keys();
        let last = state.as_deref().and_then(|st| st.told(roots));
        let mut decision = notify::decide(now, &keys, last.as_ref(), setup.remind_every);
        if partial {
            if !matches!(&decision, Decision::Alarm { new } if !new.is_empty()) {
                decision = Decision::Quiet;
            }
            if let Some(last) = last.as_ref().filter(|t| t.alarm) {
                keys.extend(
                    last.keys
                        .iter()
                        .filter(|k| !keys.contains(k))
                        .cloned()
                        .collect::<Vec<_>>(),
                );
            }
        }
        let ctx = Context {
            host: notify::host_name(),
            verb: verb.to_string(),
            roots: roots.iter().map(|r| state::absolute(r)).collect(),
            at: now,
            exit: exit as i32,
            repair_from: setup.repair_from.clone(),
            restic_without_password: intact::repair::restic_without_password(&setup.repair_from),
        };
        if let Some(message) = notify::compose(&ctx, &found, &decision) {
            let errors = notify::deliver(&setup.channels, &message, setup.timeout);
            if errors.is_empty() {
                if let Some(st) = state {
                    let alarm = !matches!(decision, Decision::AllClear { .. });
                    st.tell(
                        roots,
                        &Told {
                            at: now,
                            alarm,
                            keys,
                        },
                    );
                }
            } else {
                failed.extend(errors.into_iter().map(|e| {
                    format!(
                        "the owner could not be told what this run found: {e} (the next run \
                         tries again; `intact notify --test` tries the channels)"
                    )
                }));
            }
        }
    }
    if let Some(url) = &setup.heartbeat
        && !partial
        && exit == Exit::Clean
        && !interrupted
        && found.is_clear()
        && let Err(e) = notify::heartbeat(url, setup.timeout)
    {
        failed.push(format!(
            "the heartbeat could not be sent: {e}; where it is watched, silence from this \
             machine will raise an alarm"
        ));
    }
    failed
}

/// `intact notify --test`: a test message through every channel, and a heartbeat.
pub fn test(a: NotifyTestArgs) -> anyhow::Result<Exit> {
    let Some(setup) = setup(&a.notify)? else {
        return Err(usage(
            "nothing to test: name a channel with --notify URL, INTACT_NOTIFY or \
             --notify-config FILE (or a --heartbeat URL)",
        ));
    };
    let message = notify::test_message(&notify::host_name());
    let mut exit = Exit::Clean;
    for channel in &setup.channels {
        let what = match channel {
            notify::Channel::Apprise(urls) => format!(
                "apprise ({})",
                plural(urls.len(), "URL from --notify or INTACT_NOTIFY")
            ),
            notify::Channel::AppriseConfig(f) => {
                format!("apprise (configuration {})", intact::text::escape(f))
            }
            notify::Channel::Sendmail(to) => format!("sendmail to {}", to.join(", ")),
        };
        match notify::deliver(std::slice::from_ref(channel), &message, setup.timeout).pop() {
            None => eprintln!("intact: sent a test message through {what}"),
            Some(e) => {
                eprintln!("intact: error: {what}: {e}");
                exit = Exit::Trouble;
            }
        }
    }
    if intact::repair::restic_without_password(&setup.repair_from) {
        eprintln!(
            "intact: error: INTACT_REPAIR_FROM names a restic repository, but none of \
             RESTIC_PASSWORD_FILE, RESTIC_PASSWORD, RESTIC_PASSWORD_COMMAND is set: a repair \
             from it would fail (for the units, set one in /etc/default/intact)"
        );
        exit = Exit::Trouble;
    }
    if let Some(url) = &setup.heartbeat {
        match notify::heartbeat(url, setup.timeout) {
            Ok(()) => eprintln!("intact: the heartbeat URL answered"),
            Err(e) => {
                eprintln!("intact: error: the heartbeat: {e}");
                exit = Exit::Trouble;
            }
        }
    }
    Ok(exit)
}

fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {}", what.replacen("URL", "URLs", 1))
    }
}
