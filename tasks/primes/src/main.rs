//! A Starling task that counts the primes below N (first argument, or a number
//! on stdin, default 1 000 000) with a sieve of Eratosthenes and prints the
//! count and the largest. A CPU-bound task whose work grows with N.

use std::io::Read;

fn main() {
    let n = match limit() {
        Ok(n) => n,
        Err(message) => {
            eprintln!("primes: {message}");
            std::process::exit(2);
        }
    };
    let mut composite = vec![false; n.max(2)];
    let mut count = 0u64;
    let mut largest = 0usize;
    for i in 2..n {
        if composite[i] {
            continue;
        }
        count += 1;
        largest = i;
        let mut multiple = i.saturating_mul(i);
        while multiple < n {
            composite[multiple] = true;
            multiple += i;
        }
    }
    println!("{{\"below\":{n},\"count\":{count},\"largest\":{largest}}}");
}

fn limit() -> Result<usize, String> {
    if let Some(arg) = std::env::args().nth(1) {
        return arg
            .parse()
            .map_err(|_| format!("argument {arg:?} is not a whole number"));
    }
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| format!("cannot read input: {e}"))?;
    let input = input.trim();
    if input.is_empty() {
        return Ok(1_000_000);
    }
    input
        .parse()
        .map_err(|_| format!("input {input:?} is not a whole number"))
}
