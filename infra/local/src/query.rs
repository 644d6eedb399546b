//! Reads EC2 query-protocol form bodies (`Action=..&Key.1.Sub=..`) into something the handlers can
//! ask for by the SDK's wire names: flattened 1-based lists, dotted structures, filters and tag
//! specifications. Decoding itself is serde_urlencoded's job.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use crate::error::ApiError;

/// A decoded EC2 query request.
#[derive(Debug, Clone, Default)]
pub struct Query {
    map: BTreeMap<String, String>,
}

/// One `Filter.N` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    pub name: String,
    pub values: Vec<String>,
}

impl Query {
    /// Decodes a form body.
    pub fn parse(body: &[u8]) -> Result<Query, ApiError> {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(body).map_err(|e| {
            ApiError::ec2(
                400,
                "InvalidParameterValue",
                format!("malformed query body: {e}"),
            )
        })?;
        Ok(Query {
            map: pairs.into_iter().collect(),
        })
    }

    /// A request built from its parameters, as a form body would decode (the emulator's own
    /// callers: the control API's console actions).
    pub fn from_pairs(pairs: &[(&str, &str)]) -> Query {
        Query {
            map: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// Every decoded key/value pair.
    pub fn pairs(&self) -> impl Iterator<Item = (&String, &String)> {
        self.map.iter()
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.map
            .get(key)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }

    /// A required string, or `MissingParameter`.
    pub fn req(&self, key: &str) -> Result<&str, ApiError> {
        self.get(key).ok_or_else(|| {
            ApiError::ec2(
                400,
                "MissingParameter",
                format!("The request must contain the parameter {key}"),
            )
        })
    }

    pub fn int(&self, key: &str) -> Result<Option<i64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.parse::<i64>().map(Some).map_err(|_| {
                ApiError::ec2(
                    400,
                    "InvalidParameterValue",
                    format!("Value ({v}) for parameter {key} is invalid. Expected an integer."),
                )
            }),
        }
    }

    pub fn req_int(&self, key: &str) -> Result<i64, ApiError> {
        self.req(key)?;
        Ok(self.int(key)?.unwrap_or_default())
    }

    pub fn bool(&self, key: &str) -> bool {
        self.get(key) == Some("true")
    }

    pub fn time(&self, key: &str) -> Result<Option<DateTime<Utc>>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => DateTime::parse_from_rfc3339(v)
                .map(|t| Some(t.with_timezone(&Utc)))
                .map_err(|_| {
                    ApiError::ec2(
                        400,
                        "InvalidParameterValue",
                        format!("Value ({v}) for parameter {key} is not a valid timestamp"),
                    )
                }),
        }
    }

    /// A flattened list `Key.1`, `Key.2`, ... in index order.
    pub fn list(&self, key: &str) -> Vec<String> {
        let mut out = Vec::new();
        for n in 1.. {
            match self.map.get(&format!("{key}.{n}")) {
                Some(v) => out.push(v.clone()),
                None => break,
            }
        }
        out
    }

    /// How many structured entries `Key.N.*` exist (1-based, contiguous).
    pub fn count(&self, key: &str) -> usize {
        let mut n = 0;
        loop {
            let prefix = format!("{key}.{}.", n + 1);
            if self
                .map
                .range(prefix.clone()..)
                .next()
                .is_some_and(|(k, _)| k.starts_with(&prefix))
            {
                n += 1;
            } else {
                return n;
            }
        }
    }

    /// `Filter.N.Name` / `Filter.N.Value.M`.
    pub fn filters(&self) -> Vec<Filter> {
        (1..=self.count("Filter"))
            .filter_map(|n| {
                let name = self.get(&format!("Filter.{n}.Name"))?.to_string();
                Some(Filter {
                    name,
                    values: self.list(&format!("Filter.{n}.Value")),
                })
            })
            .collect()
    }

    /// Tags from `TagSpecification.N` entries whose `ResourceType` is `resource_type`.
    pub fn tag_specs(&self, resource_type: &str) -> Result<BTreeMap<String, String>, ApiError> {
        let mut tags = BTreeMap::new();
        for n in 1..=self.count("TagSpecification") {
            let rt = self.get(&format!("TagSpecification.{n}.ResourceType"));
            if rt.is_some_and(|rt| rt != resource_type) {
                continue;
            }
            tags.extend(self.tags(&format!("TagSpecification.{n}.Tag"))?);
        }
        Ok(tags)
    }

    /// `Prefix.N.Key` / `Prefix.N.Value` pairs, validated as EC2 validates tags.
    pub fn tags(&self, prefix: &str) -> Result<BTreeMap<String, String>, ApiError> {
        let mut tags = BTreeMap::new();
        for n in 1..=self.count(prefix) {
            let key = self.req(&format!("{prefix}.{n}.Key"))?.to_string();
            let value = self
                .get(&format!("{prefix}.{n}.Value"))
                .unwrap_or("")
                .to_string();
            validate_tag(&key, &value)?;
            tags.insert(key, value);
        }
        if tags.len() > 50 {
            return Err(ApiError::ec2(
                400,
                "TagLimitExceeded",
                "The maximum number of tags per resource is 50",
            ));
        }
        Ok(tags)
    }
}

fn validate_tag(key: &str, value: &str) -> Result<(), ApiError> {
    if key.len() > 127 || value.len() > 256 {
        return Err(ApiError::ec2(
            400,
            "InvalidParameterValue",
            format!("Tag key or value too long: {key}"),
        ));
    }
    if key.starts_with("aws:") {
        return Err(ApiError::ec2(
            400,
            "InvalidParameterValue",
            "Tag keys starting with 'aws:' are reserved for internal use",
        ));
    }
    Ok(())
}

/// Does `value` satisfy a filter on `name`? Multiple values are OR-ed, wildcards `*`/`?` work.
pub fn filter_matches(values: &[String], actual: &str) -> bool {
    values.iter().any(|pattern| wildcard(pattern, actual))
}

fn wildcard(pattern: &str, s: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let s: Vec<char> = s.chars().collect();
    let (mut pi, mut si, mut star, mut mark) = (0usize, 0usize, None::<usize>, 0usize);
    while si < s.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            pi += 1;
            mark = si;
        } else if let Some(st) = star {
            pi = st + 1;
            mark += 1;
            si = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}
