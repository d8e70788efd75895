//! The readable summary of a [`Report`].

use std::fmt;

use super::{KindLiveness, ModelOutcome, Report, at_s, count_of, human_us};
use crate::history::{Op, Outcome};

/// How many anomalies or violations the summary spells out before it only counts the rest.
const LISTED: usize = 20;

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seconds = self.duration_us() as f64 / 1e6;
        writeln!(f, "history: {} records over {seconds:.1} s", self.records)?;
        self.operations(f)?;
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(k, n)| format!("{k} ×{n}"))
            .collect();
        let faults = if faults.is_empty() {
            "none".to_owned()
        } else {
            faults.join(", ")
        };
        writeln!(f, "faults: {faults}")?;
        self.lock_model(f)?;
        self.safety(f)?;
        self.live(f)
    }
}

impl Report {
    fn operations(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "operations:")?;
        for op in Op::ALL {
            let counts = Outcome::ALL.map(|outcome| self.count(op, outcome));
            if counts.iter().all(|&n| n == 0) {
                continue;
            }
            let [ok, fail, info] = counts;
            writeln!(
                f,
                "  {:<16} ok {ok:>7}  fail {fail:>7}  info {info:>7}",
                op.name()
            )?;
        }
        Ok(())
    }

    fn lock_model(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = &self.holds;
        writeln!(
            f,
            "holds: {} granted: {} released with confirmation, {} lost, {} unknown; {} \
             acquisitions of unknown outcome",
            h.granted, h.confirmed, h.lost, h.unknown, h.unknown_acquisitions
        )?;
        writeln!(f, "model:")?;
        for key in &self.model {
            let verdict = match key.outcome {
                ModelOutcome::Linearizable => "linearizable",
                ModelOutcome::NotLinearizable => "NOT linearizable",
                ModelOutcome::Undecided => "UNDECIDED (out of search steps)",
            };
            let left_out = count_of(key.left_out, "acquisition", "acquisitions");
            writeln!(
                f,
                "  {:<16} {}: {verdict} ({} operations, {} of unknown outcome, {} steps; \
                 {left_out} of unknown outcome left out)",
                key.key, key.model, key.operations, key.unknown, key.steps
            )?;
        }
        Ok(())
    }

    fn safety(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_valid() {
            return writeln!(f, "safety: valid (no anomaly)");
        }
        if self.anomalies.is_empty() {
            return writeln!(f, "safety: UNDECIDED, the model search gave up on a key");
        }
        writeln!(
            f,
            "safety: INVALID, {}",
            count_of(self.anomalies.len(), "anomaly", "anomalies")
        )?;
        for anomaly in self.anomalies.iter().take(LISTED) {
            writeln!(f, "  - {anomaly}")?;
        }
        if self.anomalies.len() > LISTED {
            writeln!(f, "  ... and {} more", self.anomalies.len() - LISTED)?;
        }
        Ok(())
    }

    fn live(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let violations: Vec<_> = self.violations().collect();
        if violations.is_empty() {
            writeln!(f, "liveness: ok")?;
        } else {
            writeln!(
                f,
                "liveness: {} faults recovered too late or never",
                violations.len()
            )?;
        }
        for kind in &self.liveness {
            writeln!(f, "  {}", kind_line(kind))?;
        }
        for late in violations.iter().take(LISTED) {
            let healed = at_s(late.fault.end_us, self.first_us);
            let took = late.recovery_us.map_or_else(
                || format!("never recovered ({} observed)", human_us(late.observed_us)),
                |us| format!("recovered after {}", human_us(us)),
            );
            let bound = human_us(late.bound_us);
            writeln!(
                f,
                "  - {} on {:?} healed at {healed}: {took}, bound {bound}",
                late.kind, late.fault.key
            )?;
        }
        if violations.len() > LISTED {
            writeln!(f, "  ... and {} more", violations.len() - LISTED)?;
        }
        Ok(())
    }
}

fn kind_line(kind: &KindLiveness) -> String {
    let spread = kind.percentiles.map_or("no recovery".to_owned(), |p| {
        format!(
            "p50 {} p90 {} p99 {} max {}",
            human_us(p.p50),
            human_us(p.p90),
            human_us(p.p99),
            human_us(p.max)
        )
    });
    format!(
        "{:<10} {:>4} faults, {} unrecovered, {} over the {} bound; {spread}",
        kind.kind,
        kind.faults,
        kind.unrecovered,
        kind.violations,
        human_us(kind.bound_us)
    )
}
