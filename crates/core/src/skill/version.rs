//! A skill's human version (`version = "1.2.0"` in skill.toml): a semantic version, so that
//! versions order and a chain of migrations composes (`migrations/`, named by the version each
//! starts from).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A skill's `version`, as written in skill.toml (kept as written, compared as a semantic
/// version).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SkillVersion(semver::Version);

impl SkillVersion {
    /// Parses `text` as a semantic version (`MAJOR.MINOR.PATCH`, optionally `-pre` and
    /// `+build`); the error says what was expected.
    pub fn parse(text: &str) -> Result<Self, String> {
        semver::Version::parse(text)
            .map(Self)
            .map_err(|e| format!("`{text}` is not a semantic version such as 1.2.0 ({e})"))
    }
}

impl PartialOrd for SkillVersion {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for SkillVersion {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0
            .cmp_precedence(&other.0)
            .then_with(|| self.0.cmp(&other.0))
    }
}

impl fmt::Display for SkillVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Serialize for SkillVersion {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for SkillVersion {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_order_as_semantic_versions() {
        let v = |t: &str| SkillVersion::parse(t).unwrap();
        assert!(v("1.10.0") > v("1.9.3"));
        assert!(v("2.0.0-rc.1") < v("2.0.0"));
        assert_eq!(v("1.2.0").to_string(), "1.2.0");
        let error = SkillVersion::parse("1.2").unwrap_err();
        assert!(error.contains("`1.2` is not a semantic version"), "{error}");
    }
}
