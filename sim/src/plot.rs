//! SVG charts comparing replays: GPU utilization over time (top) and the
//! cumulative distribution of job completion times (bottom, log-scaled
//! hours), one coloured series per report.

use std::path::Path;

use plotters::prelude::*;
use thiserror::Error;

use crate::metrics::SimReport;

/// Drawing failed; plotters' errors are flattened to text because their type
/// is generic over the backend.
#[derive(Debug, Error)]
#[error("cannot draw {path}: {message}")]
pub struct PlotError {
    pub path: String,
    pub message: String,
}

const SERIES_COLOURS: [RGBColor; 6] = [
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];

/// Writes both charts for `reports` to `path`.
pub fn write_svg(path: &Path, reports: &[SimReport]) -> Result<(), PlotError> {
    let fail = |message: String| PlotError {
        path: path.display().to_string(),
        message,
    };
    let root = SVGBackend::new(path, (1000, 900)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let (top, bottom) = root.split_vertically(450);
    draw_utilization(&top, reports).map_err(fail)?;
    draw_jct_cdf(&bottom, reports).map_err(fail)?;
    root.present().map_err(|e| fail(e.to_string()))
}

fn colour(index: usize) -> RGBColor {
    SERIES_COLOURS[index % SERIES_COLOURS.len()]
}

fn draw_utilization(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    reports: &[SimReport],
) -> Result<(), String> {
    let max_hours = reports
        .iter()
        .flat_map(|r| r.utilization_series.iter().map(|p| p[0] / 3600.0))
        .fold(0.0f64, f64::max)
        .max(1.0);
    let mut chart = ChartBuilder::on(area)
        .caption("GPU utilization over time", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..max_hours * 1.02, 0.0..1.05)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("hours since first submission")
        .y_desc("allocated / total GPUs")
        .draw()
        .map_err(|e| e.to_string())?;
    for (index, report) in reports.iter().enumerate() {
        let style = colour(index);
        chart
            .draw_series(LineSeries::new(
                report
                    .utilization_series
                    .iter()
                    .map(|p| (p[0] / 3600.0, p[1])),
                style.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?
            .label(format!(
                "{} ({:.0}% avg)",
                report.policy,
                report.gpu_utilization * 100.0
            ))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], style.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| e.to_string())
}

fn draw_jct_cdf(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    reports: &[SimReport],
) -> Result<(), String> {
    // Hours on a log axis: JCTs span seconds to months.
    const FLOOR_HOURS: f64 = 1.0 / 60.0;
    let max_hours = reports
        .iter()
        .flat_map(|r| r.jct_cdf.iter().map(|p| p[0] / 3600.0))
        .fold(FLOOR_HOURS * 10.0, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption("Job completion time CDF", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d((FLOOR_HOURS..max_hours * 1.5).log_scale(), 0.0..1.02)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("job completion time (hours, log)")
        .y_desc("fraction of finished jobs")
        .draw()
        .map_err(|e| e.to_string())?;
    for (index, report) in reports.iter().enumerate() {
        let style = colour(index);
        chart
            .draw_series(LineSeries::new(
                report
                    .jct_cdf
                    .iter()
                    .map(|p| ((p[0] / 3600.0).max(FLOOR_HOURS), p[1])),
                style.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?
            .label(format!(
                "{} (avg {:.1} h)",
                report.policy,
                report.avg_jct_s / 3600.0
            ))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], style.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| e.to_string())
}
