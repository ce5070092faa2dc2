//! The two bounds on the server's rate that a 429 lets the controller
//! prove from the epoch's successes (see the parent module's docs).

use super::NANOS_PER_SEC;

/// A recorded success: when it was sent and when its reply came.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sample {
    pub(super) sent: u64,
    /// At or after `sent`.
    pub(super) recv: u64,
}

impl Sample {
    /// When the server saw the request: halfway through its round trip.
    pub(super) fn arrival(&self) -> u64 {
        self.sent + self.rtt() / 2
    }

    pub(super) fn rtt(&self) -> u64 {
        self.recv - self.sent
    }
}

/// The floor and the ceiling the epoch's successes prove about the
/// server's rate, given the `refusal` (sent at `rate`, after `idle` ns
/// without requests), a server burst `b`, and round trips that vary by
/// `spread` ns (see the module docs). 0 and +∞ when they prove nothing.
pub(super) fn bounds(
    epoch: &[Sample],
    refusal: Sample,
    b: f64,
    rate: f64,
    idle: u64,
    spread: u64,
) -> (f64, f64) {
    let mut arrivals: Vec<u64> = epoch.iter().map(Sample::arrival).collect();
    arrivals.sort_unstable();
    // Floor: `n` successes within `span` prove `R >= (n - b) / span`.
    let mut floor = 0.0f64;
    for j in 0..arrivals.len() {
        for i in 0..j {
            let n = (j - i + 1) as f64;
            let span = arrivals[j] - arrivals[i];
            if n > b && span > 0 {
                floor = floor.max((n - b) * NANOS_PER_SEC / span as f64);
            }
        }
    }
    // Ceiling: some success `i` before the refusal has
    // `R < (n_i + 1 - b) / (refusal - arrival_i)`. It needs every success
    // before the refusal: when round trips differ by more than a period,
    // some may still be in flight, and the ceiling proves nothing.
    if spread as f64 * rate >= NANOS_PER_SEC {
        return (floor, f64::INFINITY);
    }
    let refused = refusal.arrival();
    let before = arrivals.partition_point(|&a| a < refused);
    let mut ceiling = 0.0f64;
    for (i, &a) in arrivals[..before].iter().enumerate() {
        let n = (before - i) as f64;
        let span = refused - a;
        if n + 1.0 > b {
            ceiling = ceiling.max((n + 1.0 - b) * NANOS_PER_SEC / span as f64);
        }
    }
    // ... and a server bucket that was full when the epoch began: idle
    // long enough to refill `b` requests (at a rate near the ceiling).
    let refilled = ceiling * idle as f64 >= b * NANOS_PER_SEC;
    if ceiling == 0.0 || ceiling < floor || !refilled {
        // Nothing proven, or the model does not fit (a larger burst, or
        // other clients on the same quota).
        ceiling = f64::INFINITY;
    }
    (floor, ceiling)
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// GCRA at `rate`/s with burst `b`, as a server would run it.
    struct Server {
        period: u64,
        tolerance: u64,
        tat: u64,
    }

    impl Server {
        fn new(rate: f64, b: u64) -> Server {
            let period = (NANOS_PER_SEC / rate).round() as u64;
            Server {
                period,
                tolerance: b * period,
                tat: 0,
            }
        }

        fn admit(&mut self, at: u64) -> bool {
            let ok = self.tat.saturating_sub(self.tolerance - self.period) <= at;
            if ok {
                self.tat = self.tat.max(at) + self.period;
            }
            ok
        }
    }

    /// Sends from a full server at a random, rising pace until the first
    /// refusal; returns the successes and the refusal.
    fn until_refused(
        rng: &mut fastrand::Rng,
        server: &mut Server,
        rtt: u64,
    ) -> (Vec<Sample>, Sample) {
        let mut t = 10_000 * MS; // long idle: the server is full
        let mut gap = rng.u64(1..4 * server.period);
        let mut ok = Vec::new();
        loop {
            let s = Sample {
                sent: t,
                recv: t + rtt,
            };
            if !server.admit(s.arrival()) {
                return (ok, s);
            }
            ok.push(s);
            t += gap;
            gap = gap * rng.u64(90..100) / 100 + 1;
        }
    }

    #[test]
    fn the_bounds_hold_the_servers_rate() {
        let mut rng = fastrand::Rng::with_seed(11);
        for _ in 0..2_000 {
            let rate = 0.5 + rng.f64() * 200.0;
            let b = rng.u64(1..6);
            let rtt = rng.u64(0..100 * MS);
            let mut server = Server::new(rate, b);
            let (ok, refusal) = until_refused(&mut rng, &mut server, rtt);
            let actual = NANOS_PER_SEC / server.period as f64;
            let (floor, ceiling) = bounds(&ok, refusal, b as f64, 1e9, u64::MAX, 0);
            assert!(
                floor <= actual * 1.000_001,
                "floor {floor} > {actual} (b {b})"
            );
            assert!(ceiling > actual, "ceiling {ceiling} <= {actual} (b {b})");
        }
    }

    #[test]
    fn an_untrusted_ceiling_proves_nothing() {
        let ok: Vec<Sample> = (0..10)
            .map(|i| Sample {
                sent: i * 100 * MS,
                recv: i * 100 * MS + MS,
            })
            .collect();
        let refusal = Sample {
            sent: 1000 * MS,
            recv: 1001 * MS,
        };
        let (_, trusted) = bounds(&ok, refusal, 2.0, 10.0, u64::MAX, 0);
        assert!(trusted.is_finite());
        // Round trips vary by more than a period.
        assert_eq!(
            bounds(&ok, refusal, 2.0, 10.0, u64::MAX, 200 * MS).1,
            f64::INFINITY
        );
        // Too short a pause before the epoch to refill the server.
        assert_eq!(bounds(&ok, refusal, 2.0, 10.0, MS, 0).1, f64::INFINITY);
    }
}
