//! Upstream health as a pure state machine with thresholds.
//!
//! `fall` consecutive failures take an up target down; `rise` consecutive successes bring a
//! down target up. Active probes and passive results (real requests) feed the same machine;
//! a single success resets the failure streak and vice versa, so flapping needs whole
//! streaks to change state.

/// Thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HealthThresholds {
    /// Consecutive failures that mark a target down (default 3).
    pub fall: u32,
    /// Consecutive successes that mark it up again (default 2).
    pub rise: u32,
}

impl Default for HealthThresholds {
    fn default() -> Self {
        HealthThresholds { fall: 3, rise: 2 }
    }
}

/// A state change worth logging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthTransition {
    /// Now up.
    Up,
    /// Now down.
    Down,
}

/// The health of one target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthMachine {
    up: bool,
    fails: u32,
    oks: u32,
}

impl HealthMachine {
    /// A new target starts up: traffic flows at once and failures take it out.
    pub fn new_up() -> Self {
        HealthMachine {
            up: true,
            fails: 0,
            oks: 0,
        }
    }

    /// Whether the target takes traffic.
    pub fn is_up(&self) -> bool {
        self.up
    }

    /// Consecutive failures seen so far.
    pub fn failure_streak(&self) -> u32 {
        self.fails
    }

    /// Feeds one observation; returns the transition it caused, if any.
    pub fn observe(&mut self, ok: bool, t: HealthThresholds) -> Option<HealthTransition> {
        if ok {
            self.fails = 0;
            self.oks = self.oks.saturating_add(1);
            if !self.up && self.oks >= t.rise.max(1) {
                self.up = true;
                return Some(HealthTransition::Up);
            }
        } else {
            self.oks = 0;
            self.fails = self.fails.saturating_add(1);
            if self.up && self.fails >= t.fall.max(1) {
                self.up = false;
                return Some(HealthTransition::Down);
            }
        }
        None
    }
}

/// Outlier ejection, as Envoy's consecutive-5xx detector: an engine whose health check
/// passes but whose answers are server errors is taken out of rotation for a while. The
/// ejection lasts `ejection_ms` times the number of ejections so far (capped at 10x), so
/// an engine that keeps failing stays out longer each time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OutlierConfig {
    /// Consecutive 5xx answers that eject the engine (0 = never; default 5).
    pub consecutive_5xx: u32,
    /// First ejection's length, ms (default 30,000).
    pub ejection_ms: u64,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        OutlierConfig {
            consecutive_5xx: 5,
            ejection_ms: 30_000,
        }
    }
}

/// One engine's 5xx streak and ejection (times are the caller's clock, in ms).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outlier {
    streak: u32,
    ejected_until: Option<u64>,
    ejections: u32,
}

impl Outlier {
    /// Feeds one answer from the engine (`server_error`: a 5xx). Returns the end of a new
    /// ejection when this answer caused one.
    pub fn observe(&mut self, server_error: bool, now_ms: u64, c: OutlierConfig) -> Option<u64> {
        if !server_error {
            self.streak = 0;
            return None;
        }
        // Answers still in flight when it was ejected do not count towards the next one.
        if self.is_ejected(now_ms) {
            return None;
        }
        self.streak = self.streak.saturating_add(1);
        if c.consecutive_5xx == 0 || self.streak < c.consecutive_5xx {
            return None;
        }
        self.ejections = self.ejections.saturating_add(1);
        self.streak = 0;
        let until = now_ms + c.ejection_ms * u64::from(self.ejections.min(10));
        self.ejected_until = Some(until);
        Some(until)
    }

    /// Whether the engine is out of rotation at `now_ms`.
    pub fn is_ejected(&self, now_ms: u64) -> bool {
        self.ejected_until.is_some_and(|u| now_ms < u)
    }

    /// Ejections so far.
    pub fn ejections(&self) -> u32 {
        self.ejections
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_5xx_eject_for_longer_each_time() {
        let c = OutlierConfig {
            consecutive_5xx: 3,
            ejection_ms: 1000,
        };
        let mut o = Outlier::default();
        assert_eq!(o.observe(true, 0, c), None);
        assert_eq!(o.observe(true, 1, c), None);
        assert_eq!(o.observe(false, 2, c), None); // a good answer breaks the streak
        assert_eq!(o.observe(true, 3, c), None);
        assert_eq!(o.observe(true, 4, c), None);
        assert_eq!(o.observe(true, 5, c), Some(1005));
        assert!(o.is_ejected(1004) && !o.is_ejected(1005));
        // Answers still in flight while ejected do not extend it.
        for t in 6..20 {
            assert_eq!(o.observe(true, t, c), None);
        }
        assert_eq!(o.ejections(), 1);
        for t in 2000..2002 {
            o.observe(true, t, c);
        }
        assert_eq!(
            o.observe(true, 2002, c),
            Some(4002),
            "second ejection is twice as long"
        );
        let off = OutlierConfig {
            consecutive_5xx: 0,
            ..c
        };
        let mut o = Outlier::default();
        assert!((0..100).all(|t| o.observe(true, t, off).is_none()));
    }

    #[test]
    fn thresholds() {
        let t = HealthThresholds { fall: 3, rise: 2 };
        let mut h = HealthMachine::new_up();
        assert_eq!(h.observe(false, t), None);
        assert_eq!(h.observe(false, t), None);
        assert_eq!(h.observe(true, t), None); // streak broken
        assert_eq!(h.observe(false, t), None);
        assert_eq!(h.observe(false, t), None);
        assert_eq!(h.observe(false, t), Some(HealthTransition::Down));
        assert!(!h.is_up());
        assert_eq!(h.observe(false, t), None);
        assert_eq!(h.observe(true, t), None);
        assert_eq!(h.observe(false, t), None);
        assert_eq!(h.observe(true, t), None);
        assert_eq!(h.observe(true, t), Some(HealthTransition::Up));
        assert!(h.is_up());
    }
}
