//! Which strategy serves a backend: the one place that maps the settings the
//! log records ([`Backend`]) to the module that decides for them.

use std::ops::Deref;

use super::Backend;
use super::deckhouse::Deckhouse;
use super::nvidia_operator::NvidiaOperatorStrategy;
use super::strategy::Strategy;

/// The strategy of `backend`, borrowing its settings.
pub fn strategy(backend: &Backend) -> StrategyRef<'_> {
    match backend {
        Backend::Deckhouse => StrategyRef::Deckhouse(Deckhouse),
        Backend::NvidiaOperator(settings) => {
            StrategyRef::NvidiaOperator(NvidiaOperatorStrategy(settings))
        }
    }
}

/// A backend's strategy, used as a `dyn Strategy`.
pub enum StrategyRef<'a> {
    Deckhouse(Deckhouse),
    NvidiaOperator(NvidiaOperatorStrategy<'a>),
}

impl<'a> Deref for StrategyRef<'a> {
    type Target = dyn Strategy + 'a;

    fn deref(&self) -> &Self::Target {
        match self {
            StrategyRef::Deckhouse(deckhouse) => deckhouse,
            StrategyRef::NvidiaOperator(nvidia) => nvidia,
        }
    }
}
