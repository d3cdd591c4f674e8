//! A Starling task that counts the lines, words and bytes on stdin and prints
//! them as one JSON object. An I/O-bound task: it streams its input once.
//!
//! Arguments: `--top N` also prints the N most frequent words.

use std::collections::HashMap;
use std::io::{self, BufRead, Write};

fn main() {
    let top = parse_top(std::env::args().skip(1));
    let stdin = io::stdin();
    let (mut lines, mut words, mut bytes) = (0u64, 0u64, 0u64);
    let mut frequency: HashMap<String, u64> = HashMap::new();
    for line in stdin.lock().split(b'\n') {
        let line = match line {
            Ok(line) => line,
            Err(error) => {
                eprintln!("wordcount: cannot read input: {error}");
                std::process::exit(2);
            }
        };
        lines += 1;
        bytes += line.len() as u64 + 1;
        for word in String::from_utf8_lossy(&line).split_whitespace() {
            words += 1;
            if top > 0 {
                *frequency.entry(word.to_lowercase()).or_default() += 1;
            }
        }
    }
    let mut ranked: Vec<(String, u64)> = frequency.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    ranked.truncate(top);
    let ranked: Vec<String> = ranked
        .iter()
        .map(|(w, n)| format!("[{},{n}]", json_string(w)))
        .collect();
    let mut out = io::stdout().lock();
    let written = writeln!(
        out,
        "{{\"lines\":{lines},\"words\":{words},\"bytes\":{bytes},\"top\":[{}]}}",
        ranked.join(",")
    );
    if written.is_err() {
        // The agent caps output; nothing more useful can be said.
        std::process::exit(3);
    }
}

fn parse_top(mut args: impl Iterator<Item = String>) -> usize {
    while let Some(arg) = args.next() {
        if arg == "--top" {
            return args.next().and_then(|n| n.parse().ok()).unwrap_or(10);
        }
    }
    0
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
