//! `scrub`: verify what is due, least recently verified first, within a budget; and say how
//! far through its cycle the tree is.

use std::path::PathBuf;
use std::time::Instant;

use super::Ledger;
use crate::cli::ScrubArgs;
use crate::cli::settings::{Scrub, Settings};
use intact::engine::{Config, Work};
use intact::report::{Exit, Reporter};
use intact::scrub::{Budget, Plan, Queue};
use intact::sink::{Out, Pass};
use intact::state::{self, State};
use intact::text::{bytes, group};
use intact::verb::Verb;

pub fn run(a: ScrubArgs) -> anyhow::Result<Exit> {
    let mut s = Settings::new(Verb::Scrub, a.paths.paths, &a.common)?;
    if a.update {
        // Update's rules for what is visited: it changes files then.
        s.config.work = Work::Update;
        s.config.remove_leftovers = true;
    }
    s.record(&a.state);
    s.metrics(&a.metrics)?;
    s.notify(&a.notify)?;
    s.scrub = Some(Scrub {
        budget: Budget {
            max_bytes: a.max_bytes,
            max_percent: a.max_percent,
            older_than: a.older_than.map(|d| d.as_millis() as i64),
            timed: a.max_time.is_some(),
        },
        untagged_too: a.update,
        max_time: a.max_time,
        removal_alarm: (!a.accept_removed).then_some(a.max_removed),
    });
    let Some(redundancy) = a.protect else {
        return super::drive(s, &mut Pass);
    };
    // Parity for what is visited; none moved aside: a scrub sees only part of the tree.
    match super::protect::protector(&mut s, None, redundancy, None)? {
        Some(mut protector) => super::drive(s, &mut protector),
        None => super::drive(s, &mut Pass),
    }
}

/// Plans the scrub: walks the trees reading tags only (what will not be verified is
/// reported now), opens a cycle if none is, and queues what is due. Sets the deadline of a
/// time budget.
pub(super) fn prepare(
    s: &Settings,
    scrub: &Scrub,
    config: &mut Config,
    front: &mut Ledger<'_>,
) -> anyhow::Result<(Plan, Queue)> {
    let start = Instant::now();
    let db = front
        .state
        .as_ref()
        .and_then(|st| st.path().map(PathBuf::from));
    let mut plan = intact::scrub::plan(
        &s.config,
        &s.roots,
        scrub.untagged_too,
        &super::STOP,
        db.as_deref(),
        |report| front.send(report),
    )?;
    // The plan's connection writes next: nothing of the recorder's may be pending.
    if let Some(state) = &mut front.state {
        state.commit();
    }
    let now = state::now();
    let schedule = |plan: &mut Plan, db: Option<&std::path::Path>| -> rusqlite::Result<_> {
        plan.attach(db)?;
        // Moves first: the cycle is judged with every file where it is now.
        let gone = plan.gone(&s.roots, now, db.is_some(), scrub.removal_alarm)?;
        plan.start_cycle(now)?;
        if db.is_some() {
            plan.removed_kept = plan.removed_kept(&s.roots)?;
        }
        Ok((plan.queue(scrub.budget, scrub.untagged_too, now)?, gone))
    };
    let (queue, (gone, alarms)) =
        super::on_state(&mut front.state, &mut front.reporter.summary, |db| {
            schedule(&mut plan, db)
        })
        .map_err(|e| anyhow::anyhow!("{}", state::why(&e)))?;
    plan.gone_now = gone;
    for alarm in alarms {
        front
            .reporter
            .summary
            .vanished(alarm.describe(), alarm.removed);
    }
    if let Some(state) = &mut front.state {
        // A database opened anew (the old one was damaged) records this run too.
        state.begin_run(s.verb.name(), &s.roots);
    }
    config.deadline = scrub.max_time.map(|t| start + t);
    // A time budget spent before the first file is a scrub that never verifies: said, exit 3.
    if queue.planned.1 > 0 && config.deadline.is_some_and(|d| Instant::now() >= d) {
        front.reporter.summary.fail(
            "the time budget (--max-time) ran out while planning: nothing was verified; \
             give it more time"
                .into(),
        );
    }
    Ok((plan, queue))
}

/// Says how far through its cycle the tree is, for people and in the JSON summary; nothing
/// of a cycle that was not planned whole (an interrupted walk, a database that failed).
pub(super) fn conclude<W: std::io::Write, E: std::io::Write>(
    plan: &Plan,
    state: Option<&mut State>,
    reporter: &mut Reporter<W, E>,
    interrupted: bool,
) -> std::io::Result<()> {
    if let Some(state) = state {
        state.commit();
    }
    if let Some(e) = plan.failure() {
        reporter.summary.fail(format!(
            "reading the scrub's queue: {e}; the rest was not verified"
        ));
    }
    if !plan.complete || plan.cycle_started == 0 {
        return Ok(());
    }
    let Ok((files, size)) = plan.cycle_progress() else {
        return Ok(());
    };
    let (total_files, total_bytes) = plan.tagged;
    let started = intact::text::time_ms(plan.cycle_started);
    let complete = files >= total_files && total_files > 0 && !interrupted;
    let verified = reporter.summary.bytes;
    let runs_left = if complete || verified == 0 {
        None
    } else {
        Some((total_bytes - size.min(total_bytes)).div_ceil(verified))
    };
    let mut line = format!(
        "scrub: cycle since {started}: {} of {} tagged files checked ({} of {}, {})",
        group(files),
        group(total_files),
        bytes(size),
        bytes(total_bytes),
        intact::text::percent(size, total_bytes)
    );
    match runs_left {
        _ if complete => line.push_str("; the cycle is complete"),
        Some(n) => line.push_str(&format!(
            "; about {n} more {} like this one",
            if n == 1 { "run" } else { "runs" }
        )),
        None => {}
    }
    reporter.note(line);
    reporter.summary.cycle = Some(intact::report::Cycle {
        started,
        files_checked: files,
        bytes_checked: size,
        files: total_files,
        bytes: total_bytes,
        complete,
    });
    Ok(())
}
