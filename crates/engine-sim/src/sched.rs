//! The time model, sans I/O: a continuous-batching scheduler with chunked prefill.
//!
//! Each step has a token budget. Running decodes take one token each; what is left goes to
//! prefill chunks of admitted requests, first come first served. A step lasts
//!
//! ```text
//! step = decode_base + decode_per_req * batch + prefill_tokens / prefill_tps
//! ```
//!
//! so prefill work delays every decode in the same step, decode slows as the batch grows,
//! and at most `max_running` requests are admitted (the rest wait in a queue).

use std::collections::VecDeque;
use std::time::Duration;

/// Speeds and limits of one rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimeModel {
    /// Prefill throughput in tokens per second.
    pub prefill_tps: f64,
    /// Fixed cost of one step.
    pub decode_base: Duration,
    /// Extra cost per request in the batch.
    pub decode_per_req: Duration,
    /// Tokens per step (max_num_batched_tokens).
    pub token_budget: u32,
    /// Requests admitted at once (max_num_seqs).
    pub max_running: usize,
}

impl Default for TimeModel {
    fn default() -> Self {
        TimeModel {
            prefill_tps: 20_000.0,
            decode_base: Duration::from_millis(15),
            decode_per_req: Duration::from_micros(400),
            token_budget: 2048,
            max_running: 32,
        }
    }
}

impl TimeModel {
    /// Duration of a step with `batch` requests and `prefill_tokens` prefilled.
    pub fn step_time(&self, batch: usize, prefill_tokens: u32) -> Duration {
        self.decode_base
            + self.decode_per_req * batch as u32
            + Duration::from_secs_f64(f64::from(prefill_tokens) / self.prefill_tps.max(1.0))
    }
}

/// A request inside the scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// Caller's id.
    pub id: u64,
    /// Uncached prompt tokens still to prefill.
    pub prefill_left: u32,
    /// Tokens still to generate.
    pub decode_left: u32,
}

/// What a step produced.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Step {
    /// How long it took.
    pub duration: Duration,
    /// Jobs that emitted one token this step.
    pub tokens: Vec<u64>,
    /// Jobs that finished this step (after their last token).
    pub finished: Vec<u64>,
}

/// One rank's scheduler.
#[derive(Debug, Default)]
pub struct Scheduler {
    model: TimeModel,
    waiting: VecDeque<Job>,
    running: Vec<Job>,
}

impl Scheduler {
    /// An idle scheduler.
    pub fn new(model: TimeModel) -> Self {
        Scheduler {
            model,
            waiting: VecDeque::new(),
            running: Vec::new(),
        }
    }

    /// Queues a job.
    pub fn add(&mut self, job: Job) {
        self.waiting.push_back(job);
    }

    /// Drops a job (its client left).
    pub fn cancel(&mut self, id: u64) {
        self.waiting.retain(|j| j.id != id);
        self.running.retain(|j| j.id != id);
    }

    /// Requests admitted.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Requests queued.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Whether there is nothing to do.
    pub fn idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// Runs one step.
    pub fn step(&mut self) -> Step {
        while self.running.len() < self.model.max_running {
            match self.waiting.pop_front() {
                Some(j) => self.running.push(j),
                None => break,
            }
        }
        let mut out = Step::default();
        if self.running.is_empty() {
            return out;
        }
        let decoding = self.running.iter().filter(|j| j.prefill_left == 0).count() as u32;
        let mut budget = self.model.token_budget.saturating_sub(decoding);
        let mut prefilled = 0;
        for j in self.running.iter_mut() {
            if j.prefill_left == 0 {
                j.decode_left = j.decode_left.saturating_sub(1);
                out.tokens.push(j.id);
            } else if budget > 0 {
                let n = j.prefill_left.min(budget);
                j.prefill_left -= n;
                budget -= n;
                prefilled += n;
                if j.prefill_left == 0 {
                    // The step that completes prefill samples the first token.
                    j.decode_left = j.decode_left.saturating_sub(1);
                    out.tokens.push(j.id);
                }
            }
        }
        out.duration = self.model.step_time(self.running.len(), prefilled);
        self.running.retain(|j| {
            let done = j.prefill_left == 0 && j.decode_left == 0;
            if done {
                out.finished.push(j.id);
            }
            !done
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Logical time until job `id` gets its first token, with `others` already running.
    fn ttft(model: TimeModel, uncached: u32, others: &[Job]) -> Duration {
        let mut s = Scheduler::new(model);
        for o in others {
            s.add(o.clone());
        }
        s.add(Job {
            id: 0,
            prefill_left: uncached,
            decode_left: 10,
        });
        let mut t = Duration::ZERO;
        for _ in 0..100_000 {
            let st = s.step();
            t += st.duration;
            if st.tokens.contains(&0) {
                return t;
            }
        }
        panic!("no first token");
    }

    fn busy(n: u64, prefill: u32) -> Vec<Job> {
        (1..=n)
            .map(|id| Job {
                id,
                prefill_left: prefill,
                decode_left: 200,
            })
            .collect()
    }

    #[test]
    fn ttft_is_monotone_in_uncached_tokens() {
        let m = TimeModel::default();
        let mut last = Duration::ZERO;
        for u in [1, 100, 1000, 5000, 20_000, 40_000] {
            let t = ttft(m, u, &[]);
            assert!(t >= last, "{u}: {t:?} < {last:?}");
            last = t;
        }
        // 40k uncached tokens at 20k tok/s is about 2 s of prefill.
        assert!(last >= Duration::from_millis(1900), "{last:?}");
    }

    #[test]
    fn ttft_is_monotone_in_load() {
        let m = TimeModel::default();
        let mut last = Duration::ZERO;
        for n in [0, 1, 4, 16, 31] {
            let t = ttft(m, 2000, &busy(n, 4000));
            assert!(t >= last, "{n}: {t:?} < {last:?}");
            last = t;
        }
    }

    #[test]
    fn decode_slows_with_batch_and_prefill_delays_decode() {
        let m = TimeModel::default();
        assert!(m.step_time(32, 0) > m.step_time(1, 0));
        assert!(m.step_time(4, 2000) > m.step_time(4, 0));
    }

    #[test]
    fn max_running_queues_the_rest() {
        let m = TimeModel {
            max_running: 2,
            ..TimeModel::default()
        };
        let mut s = Scheduler::new(m);
        for j in busy(3, 10) {
            s.add(j);
        }
        s.step();
        assert_eq!(s.running(), 2);
        assert_eq!(s.waiting(), 1);
        s.cancel(1);
        s.step();
        assert_eq!(s.running(), 2);
        assert_eq!(s.waiting(), 0);
    }

    #[test]
    fn jobs_finish_after_their_tokens() {
        let mut s = Scheduler::new(TimeModel::default());
        s.add(Job {
            id: 7,
            prefill_left: 100,
            decode_left: 3,
        });
        let mut tokens = 0;
        let mut finished = false;
        for _ in 0..10 {
            let st = s.step();
            tokens += st.tokens.iter().filter(|i| **i == 7).count();
            finished |= st.finished.contains(&7);
        }
        assert_eq!(tokens, 3);
        assert!(finished && s.idle());
    }
}
