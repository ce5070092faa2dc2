//! Feature `metrics`: the admission decisions through the `metrics` facade
//! (whatever recorder the program installed: Prometheus, StatsD, ...).
//!
//! | name | kind | labels |
//! | --- | --- | --- |
//! | `backpressure_admitted_total` | counter | `tool` |
//! | `backpressure_refused_total` | counter | `tool`, `status` |
//! | `backpressure_in_flight` | gauge | `tool` |
//! | `backpressure_admission_wait_seconds` | histogram | `tool` |
//!
//! Labels carry the tool's name; the credential is never a label (it may
//! be secret, and is unbounded). With this feature `admit`'s success path
//! allocates (the facade builds label keys on the heap).

use std::sync::Arc;

use crate::throttled::Status;

fn tool(name: &Arc<str>) -> metrics::SharedString {
    metrics::SharedString::from(name.clone())
}

pub(super) fn admitted(name: &Arc<str>, asked_at: u64, admitted_at: u64) {
    let t = tool(name);
    metrics::counter!("backpressure_admitted_total", "tool" => t.clone()).increment(1);
    metrics::gauge!("backpressure_in_flight", "tool" => t.clone()).increment(1.0);
    let waited = admitted_at.saturating_sub(asked_at) as f64 / 1e9;
    metrics::histogram!("backpressure_admission_wait_seconds", "tool" => t).record(waited);
}

pub(super) fn refused(name: &str, status: Status) {
    metrics::counter!(
        "backpressure_refused_total",
        "tool" => name.to_string(),
        "status" => status.as_str()
    )
    .increment(1);
}

pub(super) fn finished(name: &Arc<str>) {
    metrics::gauge!("backpressure_in_flight", "tool" => tool(name)).decrement(1.0);
}
