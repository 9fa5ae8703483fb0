//! The generator's only source of randomness: xoshiro256** seeded through SplitMix64, written
//! here so that a seed gives the same corpus on every platform and with every crate version.
//!
//! Everything is integer arithmetic (no floating point, whose transcendental functions may round
//! differently across platforms). Sizes are drawn from tables of weighted log-uniform ranges,
//! which is how the heavy tail of tool-result sizes is expressed.

/// One SplitMix64 step: advances `state` and returns the next output.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A weighted size class: `(weight, low, high)`, drawn log-uniformly in `low..high` bytes.
pub type SizeClass = (u32, usize, usize);

/// xoshiro256** (Blackman & Vigna), seeded with four SplitMix64 outputs.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator whose whole output is fixed by `seed`.
    pub fn new(seed: u64) -> Rng {
        let mut state = seed;
        Rng {
            s: [
                splitmix64(&mut state),
                splitmix64(&mut state),
                splitmix64(&mut state),
                splitmix64(&mut state),
            ],
        }
    }

    /// An independent generator for sub-stream `stream` of `seed` (e.g. one per session), so
    /// that a session's content does not depend on how many sessions come before it.
    pub fn derive(seed: u64, stream: u64) -> Rng {
        let mut state = seed;
        let base = splitmix64(&mut state);
        let mut state = stream.wrapping_mul(0xD134_2543_DE82_EF95) ^ base;
        Rng::new(splitmix64(&mut state))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `0..n` without bias (Lemire's method); 0 when `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let mut m = u128::from(self.next_u64()) * u128::from(n);
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = u128::from(self.next_u64()) * u128::from(n);
            }
        }
        (m >> 64) as u64
    }

    /// Uniform in `lo..=hi` (`lo` when `hi < lo`).
    pub fn between(&mut self, lo: usize, hi: usize) -> usize {
        if hi <= lo {
            return lo;
        }
        lo + self.below((hi - lo) as u64 + 1) as usize
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u32) -> bool {
        self.below(100) < u64::from(percent)
    }

    /// One element of `items`, uniformly. `items` must not be empty.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }

    /// A reference to one element of `items`, uniformly. `items` must not be empty.
    pub fn pick_ref<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// An index into `weights`, with probability proportional to its weight.
    pub fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
        let mut x = self.below(total);
        for (i, &w) in weights.iter().enumerate() {
            if x < u64::from(w) {
                return i;
            }
            x -= u64::from(w);
        }
        weights.len().saturating_sub(1)
    }

    /// Log-uniform in `lo..hi`: an octave (a doubling of `lo`) is chosen uniformly, then a value
    /// uniformly inside it, so small values are as likely per octave as large ones.
    pub fn log_uniform(&mut self, lo: usize, hi: usize) -> usize {
        let lo = lo.max(1);
        if hi <= lo + 1 {
            return lo;
        }
        let mut octaves = 0u32;
        let mut a = lo;
        while a < hi {
            octaves += 1;
            a = a.saturating_mul(2);
        }
        let k = self.below(u64::from(octaves)) as u32;
        let start = lo << k;
        let end = start.saturating_mul(2).min(hi);
        start + self.below((end - start) as u64) as usize
    }

    /// A size drawn from a table of weighted classes.
    pub fn size(&mut self, classes: &[SizeClass]) -> usize {
        let weights: Vec<u32> = classes.iter().map(|c| c.0).collect();
        let (_, lo, hi) = classes[self.weighted(&weights)];
        self.log_uniform(lo, hi)
    }

    /// `n` characters from `[A-Za-z0-9]`.
    pub fn alnum(&mut self, n: usize) -> String {
        const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        (0..n).map(|_| char::from(self.pick(ALNUM))).collect()
    }

    /// `n` lowercase hexadecimal digits.
    pub fn hex(&mut self, n: usize) -> String {
        const HEX: &[u8] = b"0123456789abcdef";
        (0..n).map(|_| char::from(self.pick(HEX))).collect()
    }

    /// `n` decimal digits (the first one may be 0).
    pub fn digits(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| char::from(b'0' + self.below(10) as u8))
            .collect()
    }

    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        let mut state = 1234567;
        let got: Vec<u64> = (0..5).map(|_| splitmix64(&mut state)).collect();
        assert_eq!(
            got,
            [
                6457827717110365317,
                3203168211198807973,
                9817491932198370423,
                4593380528125082431,
                16408922859458223821
            ]
        );
    }

    #[test]
    fn xoshiro_matches_the_reference_sequence() {
        // Reference: the C implementation with state {1, 2, 3, 4}.
        let mut rng = Rng { s: [1, 2, 3, 4] };
        let got: Vec<u64> = (0..4).map(|_| rng.next_u64()).collect();
        assert_eq!(got, [11520, 0, 1509978240, 1215971899390074240]);
    }

    #[test]
    fn same_seed_same_stream_and_streams_differ() {
        let a: Vec<u64> = (0..8)
            .map({
                let mut r = Rng::derive(42, 3);
                move |_| r.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..8)
            .map({
                let mut r = Rng::derive(42, 3);
                move |_| r.next_u64()
            })
            .collect();
        let c: Vec<u64> = (0..8)
            .map({
                let mut r = Rng::derive(42, 4);
                move |_| r.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn bounded_draws_stay_in_range() {
        let mut rng = Rng::new(7);
        for _ in 0..10_000 {
            assert!(rng.below(7) < 7);
            let x = rng.between(3, 9);
            assert!((3..=9).contains(&x));
            let y = rng.log_uniform(10, 100_000);
            assert!((10..100_000).contains(&y), "{y}");
        }
        assert_eq!(rng.below(0), 0);
        assert_eq!(rng.between(5, 5), 5);
    }

    #[test]
    fn log_uniform_reaches_every_octave() {
        let mut rng = Rng::new(1);
        let draws: Vec<usize> = (0..2_000).map(|_| rng.log_uniform(1, 1 << 20)).collect();
        assert!(draws.iter().any(|&x| x < 16));
        assert!(draws.iter().any(|&x| x > 1 << 19));
    }

    #[test]
    fn weighted_follows_weights() {
        let mut rng = Rng::new(9);
        let mut counts = [0usize; 3];
        for _ in 0..9_000 {
            counts[rng.weighted(&[1, 0, 2])] += 1;
        }
        assert_eq!(counts[1], 0);
        assert!(counts[2] > counts[0] * 3 / 2, "{counts:?}");
    }
}
