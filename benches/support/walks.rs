//! The key walks the keyed benches share.

/// A fixed pseudo-random walk over `keys` keys, each once per round.
pub fn round_robin(keys: u64) -> Vec<u64> {
    let stride = 0x9E37_79B9_7F4A_7C15u64 | 1;
    (0..keys).map(|i| i.wrapping_mul(stride) % keys).collect()
}

/// Zipf-like (s = 1) draws over `keys` keys: key `k` (from 1) is drawn
/// with probability proportional to `1 / k`, shuffled across the key
/// space so hot keys do not share shards by index.
pub fn zipf(keys: u64, draws: usize) -> Vec<u64> {
    let mut cdf = Vec::with_capacity(keys as usize);
    let mut sum = 0.0f64;
    for k in 1..=keys {
        sum += 1.0 / k as f64;
        cdf.push(sum);
    }
    let mut rng = fastrand::Rng::with_seed(13);
    (0..draws)
        .map(|_| {
            let u = rng.f64() * sum;
            let rank = cdf.partition_point(|&c| c < u) as u64;
            rank.wrapping_mul(0x9E37_79B9_7F4A_7C15) % keys
        })
        .collect()
}
