//! Parsing and checking a scenario file, with errors that name the field and
//! its line.

use super::{LoadSpec, Scenario, TaskType};

/// Why a scenario file cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScenarioError {
    /// The TOML does not parse into a scenario (syntax, a missing or unknown
    /// field, a value of the wrong type).
    #[error("scenario line {line}: {field}: {message}")]
    Parse {
        /// 1-based line of the offending text.
        line: usize,
        /// The field, or `(syntax)` when the text is not TOML at all.
        field: String,
        /// The parser's words.
        message: String,
    },
    /// A value parses but is out of range or contradicts another.
    #[error("scenario line {line}: {field}: {message}")]
    Invalid {
        /// 1-based line of the field (0 when the file does not spell it out).
        line: usize,
        /// Dotted path of the field, e.g. `device[2].cores`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// No shipped scenario has that name.
    #[error("no shipped scenario {name:?}; shipped: {}", valid.join(", "))]
    Unknown {
        /// The name asked for.
        name: String,
        /// The shipped names.
        valid: Vec<String>,
    },
}

/// Parses and checks a scenario.
pub fn parse(text: &str) -> Result<Scenario, ScenarioError> {
    let scenario: Scenario = toml::from_str(text).map_err(|error| parse_error(text, &error))?;
    check(text, &scenario)?;
    Ok(scenario)
}

/// The line (1-based) of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()
        .get(..end)
        .map_or(0, |head| head.iter().filter(|byte| **byte == b'\n').count())
        + 1
}

/// The field a parse error is about: the name the message quotes in
/// backticks (missing and unknown fields), else the key on the error's line.
fn parse_error(text: &str, error: &toml::de::Error) -> ScenarioError {
    let message = error.message().trim().to_owned();
    let start = error.span().map_or(0, |span| span.start);
    let line = line_of(text, start);
    let quoted = message
        .split('`')
        .nth(1)
        .filter(|name| !name.is_empty() && !name.contains(' '))
        .map(str::to_owned);
    let key_on_line = text
        .lines()
        .nth(line.saturating_sub(1))
        .and_then(|source| source.split_once('='))
        .map(|(key, _)| key.trim().to_owned())
        .filter(|key| !key.is_empty() && !key.starts_with('['));
    let field = quoted
        .or(key_on_line)
        .unwrap_or_else(|| "(syntax)".to_owned());
    ScenarioError::Parse {
        line,
        field,
        message,
    }
}

/// Finds the line of `key` inside the `index`-th `[[table]]` (or `[table]`
/// when `index` is `None`), 0 when absent: for errors found after parsing.
fn locate(text: &str, table: &str, index: Option<usize>, key: &str) -> usize {
    let header_array = format!("[[{table}]]");
    let header_single = format!("[{table}]");
    let mut seen = 0_usize;
    let mut inside = false;
    let mut block_line = 0;
    for (number, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.starts_with('[') {
            let matches = match index {
                Some(wanted) => {
                    if line.starts_with(&header_array) {
                        seen += 1;
                        seen == wanted + 1
                    } else {
                        // A sub-table (`[device.opencl]`) stays in its block.
                        inside && line.starts_with(&format!("[{table}."))
                    }
                }
                None => line.starts_with(&header_single),
            };
            if matches && !inside {
                block_line = number + 1;
            }
            inside = matches;
            continue;
        }
        if inside {
            if let Some((name, _)) = line.split_once('=') {
                if name.trim() == key {
                    return number + 1;
                }
            }
        }
    }
    block_line
}

struct Checker<'t> {
    text: &'t str,
}

impl Checker<'_> {
    fn fail(
        &self,
        table: &str,
        index: Option<usize>,
        key: &str,
        message: impl Into<String>,
    ) -> ScenarioError {
        let field = match index {
            Some(index) => format!("{table}[{index}].{key}"),
            None => format!("{table}.{key}"),
        };
        ScenarioError::Invalid {
            line: locate(self.text, table, index, key),
            field,
            message: message.into(),
        }
    }

    fn positive(
        &self,
        table: &str,
        index: Option<usize>,
        key: &str,
        value: f64,
    ) -> Result<(), ScenarioError> {
        if value.is_finite() && value > 0.0 {
            Ok(())
        } else {
            Err(self.fail(table, index, key, "must be a positive number"))
        }
    }

    fn non_negative(
        &self,
        table: &str,
        index: Option<usize>,
        key: &str,
        value: f64,
    ) -> Result<(), ScenarioError> {
        if value.is_finite() && value >= 0.0 {
            Ok(())
        } else {
            Err(self.fail(table, index, key, "must be a non-negative number"))
        }
    }

    fn probability(
        &self,
        table: &str,
        index: Option<usize>,
        key: &str,
        value: Option<f64>,
    ) -> Result<(), ScenarioError> {
        match value {
            Some(p) if !(0.0..=1.0).contains(&p) => {
                Err(self.fail(table, index, key, "must be a probability in [0, 1]"))
            }
            _ => Ok(()),
        }
    }
}

fn check(text: &str, scenario: &Scenario) -> Result<(), ScenarioError> {
    let checker = Checker { text };
    let settings = &scenario.settings;
    let mips = settings.mips_per_reference_core;
    if let Some(value) = mips {
        checker.positive("settings", None, "mips_per_reference_core", value)?;
    }
    for seed in &settings.seeds {
        if settings.tuning_seeds.contains(seed) {
            return Err(checker.fail(
                "settings",
                None,
                "tuning_seeds",
                format!("seed {seed} is also a reported seed; tuning seeds are never reported"),
            ));
        }
    }
    if scenario.devices.is_empty() {
        return Err(checker.fail("device", Some(0), "name", "at least one device is needed"));
    }
    for (index, device) in scenario.devices.iter().enumerate() {
        let at = Some(index);
        let valid_name = !device.name.is_empty()
            && device.name.len() <= 40
            && device
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-');
        if !valid_name {
            return Err(checker.fail(
                "device",
                at,
                "name",
                "must be 1 to 40 ASCII letters, digits or '-'",
            ));
        }
        if device.count > 100_000 {
            return Err(checker.fail("device", at, "count", "must be at most 100000"));
        }
        match device.per_user {
            Some(per_user) if !(per_user.is_finite() && per_user > 0.0 && per_user <= 1000.0) => {
                return Err(checker.fail("device", at, "per_user", "must be in (0, 1000]"));
            }
            None if device.count == 0 => {
                return Err(checker.fail(
                    "device",
                    at,
                    "count",
                    "give a count of at least 1, or per_user",
                ));
            }
            _ => {}
        }
        checker.positive("device", at, "cores", device.cores)?;
        match (device.core_speed, device.mips) {
            (Some(speed), None) => checker.positive("device", at, "core_speed", speed)?,
            (None, Some(value)) => {
                checker.positive("device", at, "mips", value)?;
                if mips.is_none() {
                    return Err(checker.fail(
                        "device",
                        at,
                        "mips",
                        "needs settings.mips_per_reference_core",
                    ));
                }
            }
            _ => {
                return Err(checker.fail(
                    "device",
                    at,
                    "core_speed",
                    "give exactly one of core_speed and mips",
                ))
            }
        }
        checker.positive("device", at, "memory_gib", device.memory_gib)?;
        checker.positive("device", at, "io_mbps", device.io_mbps)?;
        checker.positive("device", at, "bandwidth_mbps", device.bandwidth_mbps)?;
        checker.non_negative("device", at, "rtt_ms", device.rtt_ms)?;
        checker.non_negative("device", at, "energy_per_bit_nj", device.energy_per_bit_nj)?;
        checker.non_negative("device", at, "idle_watts", device.idle_watts)?;
        if !(device.max_watts.is_finite() && device.max_watts >= device.idle_watts) {
            return Err(checker.fail("device", at, "max_watts", "must be at least idle_watts"));
        }
        let levels = &device.level_speeds;
        let ascending = levels.windows(2).all(|pair| pair[0] < pair[1]);
        let in_range = levels.iter().all(|speed| *speed > 0.0 && *speed <= 1.0);
        if levels.is_empty()
            || levels.len() > 8
            || !ascending
            || !in_range
            || levels.last() != Some(&1.0)
        {
            return Err(checker.fail(
                "device",
                at,
                "level_speeds",
                "must be 1 to 8 rising speeds in (0, 1], the last 1",
            ));
        }
        if let Some(rate) = device.failure_rate_per_hour {
            checker.non_negative("device", at, "failure_rate_per_hour", rate)?;
        }
        if let Some(battery) = device.battery_joules {
            checker.positive("device", at, "battery_joules", battery)?;
        }
        if let Some(opencl) = &device.opencl {
            let table = "device";
            checker.positive(table, at, "gflops", opencl.gflops)?;
            checker.positive(table, at, "memory_gib", opencl.memory_gib)?;
            checker.positive(table, at, "max_alloc_gib", opencl.max_alloc_gib)?;
            if !matches!(opencl.kind.as_str(), "gpu" | "cpu" | "accelerator") {
                return Err(checker.fail(table, at, "kind", "must be gpu, cpu or accelerator"));
            }
        }
    }
    check_tasks(&checker, scenario)?;
    check_loads(&checker, scenario)
}

fn check_tasks(checker: &Checker<'_>, scenario: &Scenario) -> Result<(), ScenarioError> {
    if scenario.tasks.is_empty() {
        return Err(checker.fail("task", Some(0), "name", "at least one task type is needed"));
    }
    let rate_based = scenario.rate_based();
    for (index, task) in scenario.tasks.iter().enumerate() {
        let at = Some(index);
        check_task(checker, scenario, task, at, rate_based)?;
    }
    Ok(())
}

fn check_task(
    checker: &Checker<'_>,
    scenario: &Scenario,
    task: &TaskType,
    at: Option<usize>,
    rate_based: bool,
) -> Result<(), ScenarioError> {
    let table = "task";
    match (task.share, task.rate_per_user_s, rate_based) {
        (Some(share), None, false) => checker.non_negative(table, at, "share", share)?,
        (None, Some(rate), true) => {
            checker.positive(table, at, "rate_per_user_s", rate)?;
            checker.probability(table, at, "users_share", Some(task.users_share))?;
        }
        _ => {
            return Err(checker.fail(
                table,
                at,
                "share",
                "give every task type a share, or every one a rate_per_user_s",
            ))
        }
    }
    if task.arrival == super::Arrival::Periodic && !rate_based {
        return Err(checker.fail(
            table,
            at,
            "arrival",
            "periodic arrivals need rate_per_user_s and loads in users",
        ));
    }
    match (task.work_s, task.length_mi) {
        (Some(work), None) => checker.positive(table, at, "work_s", work)?,
        (None, Some(length)) => {
            checker.positive(table, at, "length_mi", length)?;
            if scenario.settings.mips_per_reference_core.is_none() {
                return Err(checker.fail(
                    table,
                    at,
                    "length_mi",
                    "needs settings.mips_per_reference_core",
                ));
            }
        }
        _ => {
            return Err(checker.fail(
                table,
                at,
                "work_s",
                "give exactly one of work_s and length_mi",
            ))
        }
    }
    checker.non_negative(table, at, "work_sigma", task.work_sigma)?;
    checker.positive(table, at, "cores", task.cores)?;
    checker.positive(table, at, "wide_cores", task.wide_cores)?;
    checker.probability(table, at, "wide_share", task.wide_share)?;
    checker.probability(table, at, "opencl_share", task.opencl_share)?;
    checker.probability(table, at, "gpu_only_share", Some(task.gpu_only_share))?;
    checker.probability(table, at, "label_share", task.label_share)?;
    checker.probability(table, at, "cloud_probability", task.cloud_probability)?;
    if task.arch.values().sum::<f64>() > 1.0 || task.arch.values().any(|p| *p < 0.0) {
        return Err(checker.fail(
            table,
            at,
            "arch",
            "shares must be non-negative, at most 1 in all",
        ));
    }
    if task.label_share.is_some() && task.label.len() != 1 {
        return Err(checker.fail(table, at, "label", "label_share needs exactly one label"));
    }
    let [gpu_low, gpu_high] = task.gpu_memory_mib;
    if gpu_low == 0 || gpu_low > gpu_high || gpu_low % 64 != 0 || gpu_high % 64 != 0 {
        return Err(checker.fail(
            table,
            at,
            "gpu_memory_mib",
            "must be [min, max], multiples of 64, 0 < min <= max",
        ));
    }
    let [low, high] = task.memory_mib;
    let step = task.memory_step_mib;
    if step == 0 || low == 0 || low > high || low % step != 0 || high % step != 0 {
        return Err(checker.fail(
            table,
            at,
            "memory_mib",
            "must be [min, max], 0 < min <= max, both multiples of memory_step_mib",
        ));
    }
    checker.positive(table, at, "io_mbps", task.io_mbps)?;
    for (key, [low, high]) in [("input_kb", task.input_kb), ("output_kb", task.output_kb)] {
        if !(low.is_finite() && high.is_finite() && low >= 0.0 && low < high) {
            return Err(checker.fail(table, at, key, "must be [min, max) with 0 <= min < max"));
        }
    }
    match (task.deadline_s, task.deadline_factor) {
        (Some(deadline), None) => checker.positive(table, at, "deadline_s", deadline)?,
        (None, Some([low, high])) => {
            if !(low.is_finite() && high.is_finite() && low > 0.0 && low < high) {
                return Err(checker.fail(
                    table,
                    at,
                    "deadline_factor",
                    "must be [min, max) with 0 < min < max",
                ));
            }
        }
        _ => {
            return Err(checker.fail(
                table,
                at,
                "deadline_s",
                "give exactly one of deadline_s and deadline_factor",
            ))
        }
    }
    checker.positive(table, at, "deadline_speed", task.deadline_speed)?;
    checker.non_negative(table, at, "deadline_slack_s", task.deadline_slack_s)?;
    if task.priority[0] > task.priority[1] {
        return Err(checker.fail(table, at, "priority", "must be [min, max] with min <= max"));
    }
    Ok(())
}

fn check_loads(checker: &Checker<'_>, scenario: &Scenario) -> Result<(), ScenarioError> {
    let rate_based = scenario.rate_based();
    for (index, load) in scenario.loads.iter().enumerate() {
        let at = Some(index);
        let LoadSpec {
            utilisation, users, ..
        } = load;
        match (utilisation, users, rate_based) {
            (Some(value), None, false) => {
                if !(value.is_finite() && *value > 0.0 && *value <= 5.0) {
                    return Err(checker.fail("load", at, "utilisation", "must be in (0, 5]"));
                }
            }
            (None, Some(value), true) => checker.positive("load", at, "users", *value)?,
            (_, _, true) => {
                return Err(checker.fail(
                    "load",
                    at,
                    "users",
                    "task types with rate_per_user_s need loads given in users",
                ))
            }
            (_, _, false) => {
                return Err(checker.fail(
                    "load",
                    at,
                    "utilisation",
                    "task types with a share need loads given as a utilisation",
                ))
            }
        }
    }
    Ok(())
}
