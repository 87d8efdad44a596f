//! The simulator as an [`EffectExecutor`]: what the Kubernetes writers do to
//! the API server, it does to its cluster, in order, and cannot fail.

use std::convert::Infallible;
use std::future::Future;

use switchyard_core::effects::{Effect, EffectExecutor, Outcome};

use crate::Simulator;

impl EffectExecutor for Simulator {
    type Error = Infallible;
    fn execute(
        &mut self,
        effects: Vec<Effect>,
    ) -> impl Future<Output = Vec<Result<Outcome, Infallible>>> + Send {
        let done = effects
            .iter()
            .map(|effect| {
                Simulator::execute(self, effect);
                Ok(Outcome::default())
            })
            .collect();
        std::future::ready(done)
    }
}
