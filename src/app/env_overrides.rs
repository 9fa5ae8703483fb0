//! Environment variables that override config keys: `CONTEXT_PROXY_<SECTION>__<KEY>`, each
//! level of the key separated by a double underscore, case-insensitive:
//!
//! - `CONTEXT_PROXY_CONTEXT__MODE=off` sets `[context] mode`;
//! - `CONTEXT_PROXY_CONTEXT__RELOAD__MAX_ROUNDS=2` sets `[context.reload] max_rounds`;
//! - `CONTEXT_PROXY_UPSTREAMS__0__BASE_URL=…` sets `base_url` of the first `[[upstreams]]`.
//!
//! The value is read as a TOML value when it is one (`2`, `0.5`, `true`, `["a", "b"]`), else as
//! a string (`off`, `http://…`). An override wins over the file; the result is checked like the
//! file itself, and an error names the variable.
//!
//! Only the variables are read here, handed in by the caller (`main` passes the process's).

use std::path::Path;

use crate::app::config::{Config, ConfigError};

/// The prefix of every override variable.
pub const PREFIX: &str = "CONTEXT_PROXY_";

impl Config {
    /// Reads `path` (or the defaults when `None`) and applies the overrides among `vars`.
    pub fn load_with_env(
        path: Option<&Path>,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let (text, name) = match path {
            Some(path) => (
                std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.display().to_string(),
                    source,
                })?,
                path.display().to_string(),
            ),
            None => (String::new(), "<defaults>".to_string()),
        };
        // The file alone first, so its errors point at its lines.
        let from_file = Config::from_toml(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: name.clone(),
                message,
            },
            other => other,
        })?;
        let overrides: Vec<(String, String)> = vars
            .into_iter()
            .filter(|(k, _)| k.starts_with(PREFIX) && k.contains("__"))
            .collect();
        if overrides.is_empty() {
            return Ok(from_file);
        }
        let base: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: name.clone(),
            message: e.to_string(),
        })?;
        let mut table = base.clone();
        for (var, value) in &overrides {
            apply(&mut table, var, value)?;
        }
        match toml::Value::Table(table).try_into::<Config>() {
            Ok(config) => Ok(config),
            Err(e) => {
                // Name the variable at fault: the first that fails alone.
                for (var, value) in &overrides {
                    let mut one = base.clone();
                    apply(&mut one, var, value)?;
                    if let Err(e) = toml::Value::Table(one).try_into::<Config>() {
                        return Err(ConfigError::Env {
                            var: var.clone(),
                            message: e.to_string(),
                        });
                    }
                }
                Err(ConfigError::Invalid(format!(
                    "environment overrides {}: {e}",
                    overrides
                        .iter()
                        .map(|(k, _)| k.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )))
            }
        }
    }
}

/// Sets the key named by `var` in `table` to `raw`.
fn apply(table: &mut toml::Table, var: &str, raw: &str) -> Result<(), ConfigError> {
    let invalid = |message: String| ConfigError::Env {
        var: var.to_string(),
        message,
    };
    let path: Vec<String> = var[PREFIX.len()..]
        .split("__")
        .map(str::to_ascii_lowercase)
        .collect();
    if path.iter().any(String::is_empty) {
        return Err(invalid(
            "expected CONTEXT_PROXY_<SECTION>__<KEY> (levels separated by __)".into(),
        ));
    }
    let value = parse_value(raw);
    let (last, parents) = path.split_last().ok_or_else(|| invalid("no key".into()))?;
    let mut current = table;
    for (depth, segment) in parents.iter().enumerate() {
        let entry = current
            .entry(segment.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        current = match entry {
            toml::Value::Table(t) => t,
            // `UPSTREAMS__0__…`: an element of an array of tables, named by its index.
            toml::Value::Array(items) => {
                return set_in_array(items, &path[depth + 1..], value, &invalid);
            }
            _ => return Err(invalid(format!("{segment} is not a section"))),
        };
    }
    current.insert(last.clone(), value);
    Ok(())
}

fn set_in_array(
    items: &mut [toml::Value],
    path: &[String],
    value: toml::Value,
    invalid: &dyn Fn(String) -> ConfigError,
) -> Result<(), ConfigError> {
    let (index, rest) = path
        .split_first()
        .ok_or_else(|| invalid("no index".into()))?;
    let index: usize = index
        .parse()
        .map_err(|_| invalid(format!("{index:?} is not an index")))?;
    let len = items.len();
    let item = items.get_mut(index).ok_or_else(|| {
        invalid(format!(
            "index {index} is past the {len} entries of the file"
        ))
    })?;
    let toml::Value::Table(table) = item else {
        return Err(invalid(format!("entry {index} is not a table")));
    };
    let (last, parents) = rest
        .split_last()
        .ok_or_else(|| invalid("no key after the index".into()))?;
    let mut current = table;
    for segment in parents {
        let entry = current
            .entry(segment.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        current = match entry {
            toml::Value::Table(t) => t,
            _ => return Err(invalid(format!("{segment} is not a section"))),
        };
    }
    current.insert(last.clone(), value);
    Ok(())
}

/// `raw` as a TOML value when it is one, else as a string.
fn parse_value(raw: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::Mode;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn with_file(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, text).unwrap();
        Config::load_with_env(Some(&path), vars(env))
    }

    #[test]
    fn overrides_win_over_the_file() {
        let text = "[context]\nmode = \"auto\"\nkeep_recent_messages = 3\n[upstream]\nbase_url = \"http://a/v1\"\n";
        let config = with_file(
            text,
            &[
                ("CONTEXT_PROXY_CONTEXT__MODE", "off"),
                ("CONTEXT_PROXY_CONTEXT__RELOAD__MAX_ROUNDS", "2"),
                ("CONTEXT_PROXY_UPSTREAM__BASE_URL", "http://b/v1"),
                ("CONTEXT_PROXY_STORE__BACKEND", "memory"),
                ("UNRELATED", "x"),
            ],
        )
        .unwrap();
        assert_eq!(config.context.mode, Mode::Off);
        assert_eq!(config.context.keep_recent_messages, 3);
        assert_eq!(config.context.reload.max_rounds, 2);
        assert_eq!(config.upstream.as_ref().unwrap().base_url, "http://b/v1");
        config.validate().unwrap();
    }

    #[test]
    fn an_array_entry_is_named_by_index() {
        let text = "[[upstreams]]\nname = \"a\"\nbase_url = \"http://a/v1\"\n";
        let config = with_file(text, &[("CONTEXT_PROXY_UPSTREAMS__0__NAME", "renamed")]).unwrap();
        assert_eq!(config.upstreams[0].name, "renamed");
        let err = with_file(text, &[("CONTEXT_PROXY_UPSTREAMS__3__NAME", "x")]).unwrap_err();
        assert!(
            err.to_string().contains("CONTEXT_PROXY_UPSTREAMS__3__NAME"),
            "{err}"
        );
    }

    #[test]
    fn a_bad_override_names_the_variable_and_what_is_allowed() {
        let err = with_file("", &[("CONTEXT_PROXY_CONTEXT__MODE", "sideways")]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("CONTEXT_PROXY_CONTEXT__MODE"), "{text}");
        assert!(text.contains("compact"), "{text}");
        let err = with_file("", &[("CONTEXT_PROXY_CONTEXT__MODEE", "off")]).unwrap_err();
        assert!(err.to_string().contains("modee"), "{err}");
    }

    #[test]
    fn without_a_file_the_defaults_are_overridden() {
        let config = Config::load_with_env(
            None,
            vars(&[("CONTEXT_PROXY_SERVER__MAX_CONNECTIONS", "7")]),
        )
        .unwrap();
        assert_eq!(config.server.max_connections, 7);
    }
}
