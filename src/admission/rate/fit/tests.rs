//! The windows' placement, on plain instants.
use super::*;

const SEC: u64 = 1_000_000_000;
const TOKENS: Shape = Shape {
    limit: 2_000,
    span: SEC,
};

/// One call's windows.
fn call(entries: &[(Place, Shape, u32)]) -> Fitted {
    let mut f = Fitted::default();
    for &(p, shape, n) in entries {
        f.add(p, shape, n);
    }
    f
}

fn fitted() -> (Fits, Place) {
    let fits = Fits::default();
    let place = super::super::held::Source::Resource(0).place().unwrap();
    assert!(!fits.is_fitted(place));
    assert!(fits.fit(place));
    assert!(!fits.fit(place), "fitted once");
    (fits, place)
}

#[test]
fn a_window_lets_one_burst_through_per_span() {
    let (fits, p) = fitted();
    // 805-token calls, all ready at once: two fit a second, the rest wait.
    let at: Vec<u64> = (0..5)
        .map(|_| fits.place(&call(&[(p, TOKENS, 805)]), 0, 0).at)
        .collect();
    assert_eq!(at, [0, 0, SEC, SEC, 2 * SEC]);
    // Never more than the limit in any span starting at a placement.
    for &start in &at {
        let inside = at
            .iter()
            .filter(|&&t| t >= start && t < start + SEC)
            .count();
        assert!(inside * 805 <= 2_000, "{at:?}");
    }
}

#[test]
fn a_window_keeps_order_and_the_buckets_instant() {
    let (fits, p) = fitted();
    // The bucket's own instant is kept when the window has room.
    assert_eq!(fits.place(&call(&[(p, TOKENS, 805)]), 0, 300).at, 300);
    // A later call is never placed before an earlier one.
    assert_eq!(fits.place(&call(&[(p, TOKENS, 805)]), 0, 100).at, 300);
    // Past the limit: waits for an empty window, counted as the limit.
    assert_eq!(fits.place(&call(&[(p, TOKENS, 9_000)]), 0, 0).at, 300 + SEC);
    assert_eq!(fits.place(&call(&[(p, TOKENS, 1)]), 0, 0).at, 300 + 2 * SEC);
}

#[test]
fn a_window_forgets_what_left_and_what_was_given_back() {
    let (fits, p) = fitted();
    // Given back: the next call takes its room at once.
    let placed = fits.place(&call(&[(p, TOKENS, 2_000)]), 0, 0);
    assert_eq!(placed.at, 0);
    fits.remove(&placed);
    assert_eq!(fits.place(&call(&[(p, TOKENS, 2_000)]), 0, 0).at, 0);
    // A span later the window is empty again.
    assert_eq!(fits.place(&call(&[(p, TOKENS, 2_000)]), SEC, SEC).at, SEC);
    assert_eq!(fits.windows.lock()[0].1.log.len(), 1, "the old one left");
}

#[test]
fn no_window_no_delay() {
    let fits = Fits::default();
    let p = super::super::held::Source::Requests.place().unwrap();
    assert_eq!(fits.place(&call(&[(p, TOKENS, 2_000)]), 0, 7).at, 7);
    assert_eq!(fits.place(&call(&[(p, TOKENS, 2_000)]), 0, 7).at, 7);
    let shape = Shape::of(crate::bucket::Quota::new(2_000.0, 2_000).unwrap());
    assert_eq!((shape.limit, shape.span), (2_000, SEC + SEC / 64));
}

#[test]
fn a_call_goes_at_one_instant_in_every_window() {
    let (fits, tokens) = fitted();
    let requests = super::super::held::Source::Requests.place().unwrap();
    assert!(fits.fit(requests));
    let three = Shape {
        limit: 3,
        span: SEC,
    };
    // Requests allow three a second, tokens two: the third waits for tokens.
    let both = call(&[(requests, three, 1), (tokens, TOKENS, 805)]);
    let at: Vec<u64> = (0..4).map(|_| fits.place(&both, 0, 0).at).collect();
    assert_eq!(at, [0, 0, SEC, SEC]);
    let windows = fits.windows.lock();
    assert!(windows.iter().all(|(_, w)| w.log.len() == 4));
    assert!(windows.iter().all(|(_, w)| w.log[2].0 == SEC));
}
