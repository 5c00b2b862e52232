//! The one percentile every report uses: nearest rank (the smallest value
//! with at least the given fraction of the values at or below it), as the
//! simulator's reports and the benchmarks quote it.

/// The `fraction` (0..=1) percentile of `sorted` (ascending) by nearest
/// rank; `None` when there are no values.
pub fn percentile<T: Copy>(sorted: &[T], fraction: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (fraction * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn nearest_rank() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), Some(50));
        assert_eq!(percentile(&v, 0.99), Some(99));
        assert_eq!(percentile(&v, 1.0), Some(100));
        assert_eq!(percentile(&v, 0.0), Some(1));
        assert_eq!(percentile(&[7], 0.99), Some(7));
        assert_eq!(percentile::<u32>(&[], 0.5), None);
        // Every value at or below the answer is at least the fraction.
        for n in 1..50usize {
            let v: Vec<usize> = (0..n).collect();
            for p in [0.1, 0.5, 0.9, 0.99] {
                let x = percentile(&v, p).expect("some");
                assert!((x + 1) as f64 >= p * n as f64, "n={n} p={p} x={x}");
                assert!(x == 0 || (x as f64) < p * n as f64, "n={n} p={p} x={x}");
            }
        }
    }
}
