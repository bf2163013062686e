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

#[cfg(test)]
mod tests {
    use super::*;

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
