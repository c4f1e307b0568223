//! Unexpected errors: what no correct run produces (refused intact network input, an accepted
//! corrupted token, a host packet the SIU refused for no reason the workload expects, bad
//! input at an SMM node, …). Every one is counted under a named source, and a report's
//! `unexpected_errors` is [`Unexpected::total`] while its `problems` begin with
//! [`Unexpected::lines`] — one line per source with a count, which no cap drops — so a
//! non-zero count never comes with an empty or silent problem list.

/// Descriptions of single errors kept per collector (the counts are complete regardless).
const DETAILS_MAX: usize = 8;

/// Unexpected errors by source, with the first few described.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unexpected {
    /// Count per source, in the order sources first counted.
    sources: Vec<(String, u64)>,
    /// The first descriptions of single errors.
    details: Vec<String>,
}

impl Unexpected {
    /// Counts `n` errors of `source` (nothing when `n` is 0).
    pub fn count(&mut self, source: &str, n: u64) {
        if n == 0 {
            return;
        }
        match self.sources.iter_mut().find(|(s, _)| s == source) {
            Some((_, c)) => *c += n,
            None => self.sources.push((source.to_string(), n)),
        }
    }

    /// Counts one error of `source` and describes it (the first [`DETAILS_MAX`] are kept).
    pub fn one(&mut self, source: &str, description: String) {
        self.count(source, 1);
        self.detail(description);
    }

    /// Keeps `description` of an error already counted, if there is room.
    pub fn detail(&mut self, description: String) {
        if self.details.len() < DETAILS_MAX {
            self.details.push(description);
        }
    }

    /// Adds everything `other` counted (its descriptions while there is room).
    pub fn merge(&mut self, other: &Self) {
        for (source, n) in &other.sources {
            self.count(source, *n);
        }
        for d in &other.details {
            self.detail(d.clone());
        }
    }

    /// Errors counted, every source.
    pub fn total(&self) -> u64 {
        self.sources.iter().map(|(_, n)| n).sum()
    }

    /// One line per source (`unexpected: N SOURCE`), then the descriptions kept.
    pub fn lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .sources
            .iter()
            .map(|(s, n)| format!("unexpected: {n} {s}"))
            .collect();
        lines.extend(self.details.iter().cloned());
        lines
    }

    /// A report's problem list: [`Unexpected::lines`] first, then `others`, at most `max`
    /// lines — except that every source line stays, however many there are.
    pub fn problems(&self, others: impl IntoIterator<Item = String>, max: usize) -> Vec<String> {
        let mut out = self.lines();
        let room = max.max(self.sources.len());
        out.truncate(room);
        out.extend(others.into_iter().take(room.saturating_sub(out.len())));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counted_source_gets_a_line_that_no_cap_drops() {
        let mut u = Unexpected::default();
        u.count("refused network input", 0);
        assert_eq!(u.total(), 0);
        assert!(u.lines().is_empty());
        for i in 0..20 {
            u.one("packets the SIU refused", format!("host {i}: refused"));
        }
        u.count("corrupted tokens accepted", 2);
        assert_eq!(u.total(), 22);
        let lines = u.lines();
        assert_eq!(lines[0], "unexpected: 20 packets the SIU refused");
        assert_eq!(lines[1], "unexpected: 2 corrupted tokens accepted");
        assert_eq!(lines.len(), 2 + DETAILS_MAX);
        // A cap of 1 keeps both source lines; room left goes to the others.
        let p = u.problems(["stalled".to_string()], 1);
        assert_eq!(p.len(), 2);
        assert!(p[1].contains("corrupted tokens accepted"));
        let p = u.problems(["stalled".to_string()], 16);
        assert_eq!(p.last().map(String::as_str), Some("stalled"));
        // Merging adds counts by source.
        let mut v = Unexpected::default();
        v.count("corrupted tokens accepted", 1);
        v.merge(&u);
        assert_eq!(v.total(), 23);
        assert_eq!(v.lines()[0], "unexpected: 3 corrupted tokens accepted");
    }
}
