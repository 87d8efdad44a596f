//! The chart's Grafana dashboards read as Grafana reads them: every panel's
//! query and every query variable's selector, with Grafana's variables made
//! concrete (shared by the chart's dashboard tests and the live check of the
//! installed chart against a real Prometheus).

use std::collections::BTreeSet;

use serde_json::Value;

/// What Grafana puts for its interval variables; any duration parses the same.
pub const GRAFANA_INTERVALS: [&str; 3] = ["__rate_interval", "__interval", "__range"];

/// Every panel of `dashboard`, those inside (collapsed) rows too.
pub fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut all = Vec::new();
    for panel in dashboard["panels"]
        .as_array()
        .expect("the dashboard's panels")
    {
        all.push(panel);
        all.extend(panel["panels"].as_array().into_iter().flatten());
    }
    all
}

/// A query of a dashboard: where it is, and its PromQL as Grafana has it.
pub struct Query {
    pub place: String,
    pub expr: String,
}

/// Every PromQL query of `dashboard`: each panel target's `expr`, and the
/// series selector of each `label_values(selector, label)` variable.
pub fn queries(file: &str, dashboard: &Value) -> Vec<Query> {
    let mut found = Vec::new();
    for panel in panels(dashboard) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let place = format!("{file}: panel {}", panel["title"]);
            let expr = target["expr"].as_str();
            let expr = expr.unwrap_or_else(|| panic!("{place}: a target without expr"));
            found.push(Query {
                place,
                expr: expr.to_string(),
            });
        }
    }
    for variable in variables(dashboard).filter(|v| v["type"] == "query") {
        let place = format!("{file}: variable {}", variable["name"]);
        let query = match &variable["query"] {
            Value::Object(query) => query["query"].as_str(),
            other => other.as_str(),
        };
        let query = query.unwrap_or_else(|| panic!("{place}: no query"));
        // Grafana's own function, not PromQL: only its selector is.
        let (selector, label) = query
            .strip_prefix("label_values(")
            .and_then(|args| args.strip_suffix(')'))
            .and_then(|args| args.rsplit_once(','))
            .unwrap_or_else(|| panic!("{place}: {query:?} is not label_values(series, label)"));
        let label = label.trim();
        let is_label = |c: char| c.is_ascii_alphanumeric() || c == '_';
        assert!(
            !label.is_empty() && label.chars().all(is_label),
            "{place}: {query:?}"
        );
        found.push(Query {
            place,
            expr: selector.trim().to_string(),
        });
    }
    found
}

pub fn variables(dashboard: &Value) -> impl Iterator<Item = &Value> {
    dashboard["templating"]["list"]
        .as_array()
        .expect("the dashboard's templating list")
        .iter()
}

/// `expr` with Grafana's variables replaced as a query would get them: an
/// interval by a duration; a dashboard variable (multi-value, so a regular
/// expression of its values) by `.*`, which only a regex matcher takes the
/// way Grafana means it.
pub fn concrete(place: &str, expr: &str, defined: &BTreeSet<String>) -> String {
    assert!(
        !expr.contains("[["),
        "{place}: [[var]] is deprecated: {expr}"
    );
    let mut out = String::new();
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        let (before, after) = rest.split_at(at);
        out.push_str(before);
        let after = &after[1..];
        let (variable, consumed) = match after.strip_prefix('{') {
            Some(braced) => {
                let end = braced
                    .find('}')
                    .unwrap_or_else(|| panic!("{place}: {expr}"));
                let inner = &braced[..end];
                (inner.split(':').next().unwrap(), end + 2)
            }
            None => {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], end)
            }
        };
        if variable.is_empty() {
            // A regular expression's `$`, no variable.
            out.push('$');
        } else if GRAFANA_INTERVALS.contains(&variable) {
            out.push_str("5m");
        } else {
            assert!(
                defined.contains(variable),
                "{place}: ${variable} is no variable of the dashboard: {expr}"
            );
            let quoted = out.rsplit_once('"').map(|(head, _)| head.trim_end());
            assert!(
                quoted.is_some_and(|head| head.ends_with("=~") || head.ends_with("!~")),
                "{place}: ${variable} outside a regex matcher (=~) matches nothing once two values are selected: {expr}"
            );
            out.push_str(".*");
        }
        rest = &after[consumed..];
    }
    out.push_str(rest);
    out
}
