//! Inline SVG drawings of a node's history: the fleet's sparklines and the
//! node page's plot. Numbers only go into the markup, never text a node
//! sent, so there is nothing to escape beyond what maud does.

use maud::{html, Markup};

use super::history::Sample;

/// A series' points as an SVG `points` attribute over a `width` × `height`
/// box: gaps (`None`) are skipped, values are scaled to `0..=max`.
fn points(values: &[Option<f32>], max: f32, width: f32, height: f32) -> String {
    let step = if values.len() > 1 {
        width / (values.len() - 1) as f32
    } else {
        0.0
    };
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        1.0
    };
    let mut out = String::new();
    for (i, value) in values.iter().enumerate() {
        let Some(value) = value.filter(|value| value.is_finite()) else {
            continue;
        };
        let y = height - (value.clamp(0.0, max) / max) * height;
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&format!("{:.1},{:.1}", i as f32 * step, y));
    }
    out
}

/// A small line of recent values (0..=`max`); empty when there is no value.
pub(crate) fn sparkline(values: &[Option<f32>], max: f32, label: &str) -> Markup {
    let line = points(values, max, 60.0, 16.0);
    html! {
        svg.spark viewBox="0 0 60 16" width="60" height="16" role="img" aria-label=(label) {
            @if !line.is_empty() {
                polyline points=(line) fill="none" stroke="currentColor" stroke-width="1.2" {}
            }
        }
    }
}

/// The largest RTT in `samples`, rounded up to a tidy scale (ms).
fn rtt_scale(samples: &[Sample]) -> f32 {
    let most = samples
        .iter()
        .filter_map(|sample| sample.rtt_ms)
        .fold(0.0_f32, f32::max);
    [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]
        .into_iter()
        .find(|scale| most <= *scale)
        .unwrap_or(most)
}

/// The three sparklines of a fleet row: CPU load, memory, RTT.
pub(crate) fn row_sparklines(samples: &[Sample]) -> (Markup, Markup, Markup) {
    let cpu: Vec<Option<f32>> = samples.iter().map(|s| Some(s.cpu_load)).collect();
    let memory: Vec<Option<f32>> = samples.iter().map(|s| Some(s.memory_used)).collect();
    let rtt: Vec<Option<f32>> = samples.iter().map(|s| s.rtt_ms).collect();
    (
        sparkline(&cpu, 1.0, "CPU load, last minute"),
        sparkline(&memory, 1.0, "memory in use, last minute"),
        sparkline(&rtt, rtt_scale(samples), "round trip, last minute"),
    )
}

/// The node page's plot: CPU load, memory and, where a sensor reports it,
/// GPU load (0–100 %, left scale) and RTT (right scale) over the samples
/// kept.
pub(crate) fn plot(samples: &[Sample]) -> Markup {
    let (width, height) = (600.0, 160.0);
    let cpu: Vec<Option<f32>> = samples.iter().map(|s| Some(s.cpu_load)).collect();
    let memory: Vec<Option<f32>> = samples.iter().map(|s| Some(s.memory_used)).collect();
    let rtt: Vec<Option<f32>> = samples.iter().map(|s| s.rtt_ms).collect();
    let rtt_max = rtt_scale(samples);
    let gpu: Vec<Option<f32>> = samples.iter().map(|s| s.gpu_load).collect();
    let has_gpu = gpu.iter().any(Option::is_some);
    let seconds = match (samples.first(), samples.last()) {
        (Some(first), Some(last)) => last.at_ms.saturating_sub(first.at_ms) / 1000,
        _ => 0,
    };
    html! {
        figure.plot {
            svg viewBox="-40 -10 690 200" role="img" aria-label="telemetry history" {
                @for tick in [0.0_f32, 0.5, 1.0] {
                    @let y = height - tick * height;
                    line x1="0" x2=(width) y1=(y) y2=(y) class="grid" {}
                    text x="-6" y=(y + 4.0) text-anchor="end" { (format!("{:.0}%", tick * 100.0)) }
                    text x=(width + 6.0) y=(y + 4.0) { (format!("{} ms", tick * rtt_max)) }
                }
                polyline.cpu points=(points(&cpu, 1.0, width, height)) fill="none" {}
                polyline.mem points=(points(&memory, 1.0, width, height)) fill="none" {}
                polyline.rtt points=(points(&rtt, rtt_max, width, height)) fill="none" {}
                @if has_gpu {
                    polyline.gpu points=(points(&gpu, 1.0, width, height)) fill="none" {}
                }
                text x="0" y=(height + 20.0) { (format!("last {seconds} s, {} samples", samples.len())) }
            }
            figcaption {
                span.key.cpu { "CPU load" } " "
                span.key.mem { "memory in use" } " "
                span.key.rtt { "round trip (right scale)" }
                @if has_gpu { " " span.key.gpu { "GPU load (sensor)" } }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_scale_and_skip_gaps() {
        assert_eq!(
            points(&[Some(0.0), None, Some(1.0)], 1.0, 10.0, 10.0),
            "0.0,10.0 10.0,0.0"
        );
        assert_eq!(points(&[Some(5.0)], 1.0, 10.0, 10.0), "0.0,0.0");
        assert_eq!(points(&[], 1.0, 10.0, 10.0), "");
        assert_eq!(points(&[Some(f32::NAN)], 1.0, 10.0, 10.0), "");
    }

    #[test]
    fn an_empty_sparkline_draws_no_line() {
        assert!(!sparkline(&[], 1.0, "x").into_string().contains("polyline"));
        assert!(sparkline(&[Some(0.1), Some(0.2)], 1.0, "x")
            .into_string()
            .contains("polyline"));
    }
}
