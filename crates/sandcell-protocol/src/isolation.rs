//! What isolation a sandbox actually got, reported rather than assumed.

use serde::{Deserialize, Serialize};

/// Whether one isolation feature is in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeatureState {
    /// In force as asked.
    Active,
    /// In force but weaker than asked (the detail says how).
    Degraded,
    /// Not in force (the detail says why).
    Unavailable,
    /// Turned off by the sandbox's policy.
    Disabled,
}

/// One line of an isolation report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Feature {
    /// Short stable name: `user_ns`, `seccomp`, `landlock`, `cgroup_memory`, …
    pub name: String,
    /// Whether it is in force.
    pub state: FeatureState,
    /// What exactly is in force, or why not.
    pub detail: String,
}

/// The isolation a sandbox got, feature by feature.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IsolationReport {
    /// The features, in a stable order.
    pub features: Vec<Feature>,
}

impl IsolationReport {
    /// Adds or replaces a feature line.
    pub fn set(&mut self, name: &str, state: FeatureState, detail: impl Into<String>) {
        let detail = detail.into();
        if let Some(f) = self.features.iter_mut().find(|f| f.name == name) {
            f.state = state;
            f.detail = detail;
        } else {
            self.features.push(Feature {
                name: name.to_string(),
                state,
                detail,
            });
        }
    }

    /// Looks a feature up by name.
    pub fn get(&self, name: &str) -> Option<&Feature> {
        self.features.iter().find(|f| f.name == name)
    }

    /// Whether the named feature is active.
    pub fn is_active(&self, name: &str) -> bool {
        self.get(name)
            .is_some_and(|f| f.state == FeatureState::Active)
    }

    /// Appends every line of `other`, replacing lines of the same name.
    pub fn merge(&mut self, other: &IsolationReport) {
        for f in &other.features {
            self.set(&f.name, f.state, f.detail.clone());
        }
    }
}
