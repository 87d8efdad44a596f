//! Shared pieces of the cross-component tests in `tests/tests/`.

#![forbid(unsafe_code)]

pub mod chart;
pub mod dashboards;

use proptest::prelude::*;
use switchyard_eventlog::{AppendAck, EventLog, Expected, LogError, NewEvent, Subject};
use switchyard_proto::v1::{NodeRemoved, domain_event::Kind};

/// What the writer claims about the subject's last sequence.
#[derive(Clone, Copy, Debug)]
pub enum Expectation {
    Any,
    /// The subject's true last sequence.
    Current,
    /// One less than the true last sequence (or `Empty` where it has events).
    Stale,
}

/// One step of a random workload against the log.
#[derive(Clone, Debug)]
pub enum Op {
    Append {
        subject: usize,
        events: usize,
        expectation: Expectation,
    },
    /// The previous successful append again, same ids and expectation, as a
    /// writer does when the acknowledgement was lost.
    RetryLast,
}

pub const SUBJECTS: [&str; 4] = ["node.a", "node.b", "group.gpu", "app.ns.web"];

pub fn op() -> impl Strategy<Value = Op> {
    let expectation = prop_oneof![
        Just(Expectation::Any),
        Just(Expectation::Current),
        Just(Expectation::Stale)
    ];
    prop_oneof![
        4 => (0..SUBJECTS.len(), 1usize..5, expectation)
            .prop_map(|(subject, events, expectation)| Op::Append { subject, events, expectation }),
        1 => Just(Op::RetryLast),
    ]
}

/// The outcome of one step, comparable across backends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Stored(AppendAck),
    Refused(&'static str),
}

/// Runs `ops` against `log`; ids and times come from the step number only, so
/// two backends given the same ops receive identical events.
pub async fn run_ops(log: &dyn EventLog, ops: &[Op]) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    let mut pending_retry: Option<(Subject, Expected, Vec<NewEvent>)> = None;
    for (step, op) in ops.iter().enumerate() {
        let (subject, expected, events) = match op {
            Op::Append {
                subject,
                events,
                expectation,
            } => {
                let subject = Subject::new(SUBJECTS[*subject]).unwrap();
                let last = log.last_sequence(Some(&subject)).await.unwrap();
                let expected = match expectation {
                    Expectation::Any => Expected::Any,
                    Expectation::Current if last == 0 => Expected::Empty,
                    Expectation::Current => Expected::Sequence(last),
                    Expectation::Stale if last == 0 => Expected::Sequence(1),
                    Expectation::Stale => Expected::Sequence(last - 1),
                };
                let events = (0..*events)
                    .map(|i| {
                        let id = format!("s{step}-e{i}");
                        let event = Kind::NodeRemoved(NodeRemoved { node: id.clone() }).into();
                        NewEvent::new(id, step as i64 * 1_000 + i as i64, event)
                            .with_actor("proptest")
                    })
                    .collect();
                pending_retry = None;
                (subject, expected, events)
            }
            // Only right after the append it repeats: that is the lost-ack case
            // both backends must recognise.
            Op::RetryLast => match pending_retry.take() {
                Some(previous) => previous,
                None => continue,
            },
        };
        let result = log.append(&subject, expected, events.clone()).await;
        let outcome = match result {
            Ok(ack) => {
                if ack.duplicates == 0 {
                    pending_retry = Some((subject.clone(), expected, events.clone()));
                }
                Outcome::Stored(ack)
            }
            Err(err @ LogError::Conflict { .. }) => Outcome::Refused(err.metric_label()),
            Err(err) => panic!("step {step}: unexpected error {err}"),
        };
        outcomes.push(outcome);
    }
    outcomes
}
