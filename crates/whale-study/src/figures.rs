//! The study's figures, drawn once as SVG (embedded in `report.html`) and rendered from that
//! same SVG to PNG (for docs/results/studies.md): test mean@k against cumulative rollouts with a band over
//! seeds, the forest plot of paired differences from WHALE, and the coupling heat map.

use crate::coupling::Coupling;
use crate::palette::PALETTE;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use resvg::{tiny_skia, usvg};

#[derive(Debug, thiserror::Error)]
pub enum FigureError {
    #[error("drawing: {0}")]
    Draw(String),
    #[error("rendering the SVG to PNG: {0}")]
    Render(String),
}

/// One condition's curve over seeds: at each cumulative-rollout count, the mean over seeds of
/// the last test mean@k each seed had reached, and the least and most of them.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BandCurve {
    pub label: String,
    /// `(rollouts, mean, least, most)`.
    pub points: Vec<(u64, f64, f64, f64)>,
}

impl BandCurve {
    /// The band of `seeds`, each a curve of `(rollouts, mean@k)` sorted by rollouts. Every
    /// seed's curve is a step function (a value holds until the next evaluation), read at the
    /// union of all seeds' evaluation points from the first point every seed has.
    pub fn over_seeds(label: &str, seeds: &[Vec<(u64, f64)>]) -> Self {
        let mut xs: Vec<u64> = seeds.iter().flatten().map(|&(x, _)| x).collect();
        xs.sort_unstable();
        xs.dedup();
        let points = xs
            .into_iter()
            .filter_map(|x| {
                let values: Vec<f64> = seeds
                    .iter()
                    .map(|curve| curve.iter().take_while(|&&(at, _)| at <= x).last().map(|&(_, v)| v))
                    .collect::<Option<Vec<f64>>>()?;
                let mean = values.iter().sum::<f64>() / values.len() as f64;
                let least = values.iter().copied().fold(f64::INFINITY, f64::min);
                let most = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                Some((x, mean, least, most))
            })
            .collect();
        Self { label: label.to_string(), points }
    }
}

impl BandCurve {
    /// Whether the band is a line: one seed, or seeds that agree everywhere.
    pub fn is_a_line(&self) -> bool {
        self.points.iter().all(|&(_, _, least, most)| least == most)
    }
}

/// One row of a forest plot: a label and an estimate with its interval.
#[derive(Debug, Clone, PartialEq)]
pub struct ForestRow {
    pub label: String,
    pub value: f64,
    pub lo: f64,
    pub hi: f64,
}

fn draw_error(error: impl std::fmt::Display) -> FigureError {
    FigureError::Draw(error.to_string())
}

fn svg_of(
    size: (u32, u32),
    paint: impl FnOnce(&DrawingArea<SVGBackend, Shift>) -> Result<(), FigureError>,
) -> Result<String, FigureError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(draw_error)?;
        paint(&root)?;
        root.present().map_err(draw_error)?;
    }
    Ok(svg)
}

/// Test mean@k against cumulative training rollouts: each curve's mean over seeds as a line,
/// the range over seeds as a band.
pub fn curves_svg(title: &str, k: usize, curves: &[BandCurve]) -> Result<String, FigureError> {
    svg_of((900, 520), |root| {
        let all = curves.iter().flat_map(|c| c.points.iter());
        let max_x = all.clone().map(|p| p.0).max().unwrap_or(1).max(1) as f64;
        let top = (all.clone().map(|p| p.3).fold(0.0, f64::max) + 0.05).clamp(0.05, 1.0);
        let bottom = (all.map(|p| p.2).fold(1.0, f64::min) - 0.05).clamp(0.0, top - 0.05);
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(56)
            .build_cartesian_2d(0f64..max_x * 1.02, bottom..top)
            .map_err(draw_error)?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.2}"))
            .x_desc("cumulative training rollouts (weight phase + search)")
            .y_desc(match curves.iter().all(BandCurve::is_a_line) {
                true => format!("test mean@{k}"),
                false => format!("test mean@{k} (mean over seeds; band: range)"),
            })
            .draw()
            .map_err(draw_error)?;
        for (index, curve) in curves.iter().enumerate() {
            let color = PALETTE[index % PALETTE.len()];
            // Each line narrower than the one before, so that conditions that ran the same
            // (sequential and WHALE often do, over a short budget) show as nested lines.
            let width = 2 + 2 * (curves.len() - 1 - index) as u32;
            let steps = |pick: fn(&(u64, f64, f64, f64)) -> f64| step_line(&curve.points, pick);
            let mut band = steps(|p| p.3);
            band.extend(steps(|p| p.2).into_iter().rev());
            chart.draw_series(std::iter::once(Polygon::new(band, color.mix(0.15)))).map_err(draw_error)?;
            chart
                .draw_series(LineSeries::new(steps(|p| p.1), color.stroke_width(width)))
                .map_err(draw_error)?
                .label(curve.label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(width)));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerRight)
            .draw()
            .map_err(draw_error)
    })
}

/// A step function through `points`: each value holds until the next point's rollouts.
fn step_line(points: &[(u64, f64, f64, f64)], pick: fn(&(u64, f64, f64, f64)) -> f64) -> Vec<(f64, f64)> {
    let mut line = Vec::new();
    for (index, point) in points.iter().enumerate() {
        if index > 0 {
            line.push((point.0 as f64, pick(&points[index - 1])));
        }
        line.push((point.0 as f64, pick(point)));
    }
    line
}

/// Paired differences with their intervals, one row each, around a line at zero.
pub fn forest_svg(title: &str, rows: &[ForestRow]) -> Result<String, FigureError> {
    let height = 120 + 34 * rows.len() as u32;
    svg_of((900, height), |root| {
        let reach = rows.iter().flat_map(|r| [r.lo.abs(), r.hi.abs()]).fold(0.02, f64::max) * 1.1;
        let n = rows.len().max(1) as f64;
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(230)
            .build_cartesian_2d(-reach..reach, -0.5..n - 0.5)
            .map_err(draw_error)?;
        let label = |y: &f64| {
            let index = y.round();
            let row = (n - 1.0 - index) as usize;
            if (y - index).abs() < 1e-6 && index >= 0.0 {
                rows.get(row).map_or(String::new(), |r| r.label.clone())
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .y_labels(rows.len().max(1))
            .y_label_formatter(&label)
            .x_label_formatter(&|x| format!("{x:+.2}"))
            .x_desc("condition minus WHALE, paired over test tasks and pooled over seeds (95% CI)")
            .draw()
            .map_err(draw_error)?;
        chart.draw_series(LineSeries::new(vec![(0.0, -0.5), (0.0, n - 0.5)], BLACK)).map_err(draw_error)?;
        for (index, row) in rows.iter().enumerate() {
            let y = n - 1.0 - index as f64;
            let color = if row.hi < 0.0 || row.lo > 0.0 { PALETTE[1] } else { PALETTE[0] };
            chart
                .draw_series(LineSeries::new(vec![(row.lo, y), (row.hi, y)], color.stroke_width(2)))
                .map_err(draw_error)?;
            chart.draw_series(std::iter::once(Circle::new((row.value, y), 5, color.filled()))).map_err(draw_error)?;
        }
        Ok(())
    })
}

/// The coupling matrix: harness rows by weights columns, each cell labelled with its test
/// mean@k and shaded from the matrix's lowest (light) to its highest (dark).
pub fn heat_map_svg(title: &str, coupling: &Coupling) -> Result<String, FigureError> {
    let (rows, columns) = (coupling.harnesses.len().max(1), coupling.weights.len().max(1));
    let size = (260 + 110 * columns as u32, 140 + 60 * rows as u32);
    svg_of(size, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 18))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(130)
            .build_cartesian_2d(0f64..columns as f64, 0f64..rows as f64)
            .map_err(draw_error)?;
        let column_label = |x: &f64| centred(*x, columns).map_or(String::new(), |c| coupling.weights_label(c));
        let row_label = |y: &f64| centred(*y, rows).map_or(String::new(), |r| coupling.harness_label(rows - 1 - r));
        chart
            .configure_mesh()
            .disable_mesh()
            .x_labels(2 * columns + 1)
            .y_labels(2 * rows + 1)
            .x_label_formatter(&column_label)
            .y_label_formatter(&row_label)
            .x_desc("weights at phase boundaries")
            .y_desc("accepted harnesses")
            .draw()
            .map_err(draw_error)?;
        let values = coupling.cells.iter().map(|c| c.mean.value);
        let least = values.clone().fold(f64::INFINITY, f64::min);
        let span = (values.fold(f64::NEG_INFINITY, f64::max) - least).max(1e-9);
        for row in 0..coupling.harnesses.len() {
            for column in 0..coupling.weights.len() {
                let Some(cell) = coupling.cell(row, column) else { continue };
                let (x, y) = (column as f64, (rows - 1 - row) as f64);
                let shade = 0.1 + 0.9 * ((cell.mean.value - least) / span).clamp(0.0, 1.0);
                let fill = RGBColor(
                    (255.0 - 222.0 * shade) as u8,
                    (255.0 - 153.0 * shade) as u8,
                    (255.0 - 75.0 * shade) as u8,
                );
                chart
                    .draw_series(std::iter::once(Rectangle::new([(x, y), (x + 1.0, y + 1.0)], fill.filled())))
                    .map_err(draw_error)?;
                let ink = if shade > 0.6 { WHITE } else { BLACK };
                let text = format!("{:.3}", cell.mean.value);
                let style = ("sans-serif", 16).into_font().color(&ink).pos(Pos::new(HPos::Center, VPos::Center));
                chart.draw_series(std::iter::once(Text::new(text, (x + 0.5, y + 0.5), style))).map_err(draw_error)?;
            }
        }
        Ok(())
    })
}

/// The index of the cell whose centre is at `at` (labels sit at half-integers).
fn centred(at: f64, count: usize) -> Option<usize> {
    let index = at - 0.5;
    (index >= -1e-6 && (index - index.round()).abs() < 1e-6 && (index.round() as usize) < count)
        .then_some(index.round() as usize)
}

/// Renders an SVG to PNG, its text set in the system's sans-serif font (DejaVu Sans where
/// installed); without any font the text is left out and the rest is drawn.
pub fn png(svg: &str) -> Result<Vec<u8>, FigureError> {
    let mut options = usvg::Options::default();
    let fonts = options.fontdb_mut();
    fonts.load_system_fonts();
    let family = fonts
        .faces()
        .flat_map(|face| face.families.iter().map(|(name, _)| name.clone()))
        .find(|name| name == "DejaVu Sans")
        .or_else(|| fonts.faces().find_map(|face| face.families.first().map(|(name, _)| name.clone())));
    if let Some(family) = family {
        fonts.set_sans_serif_family(family);
    }
    let tree = usvg::Tree::from_str(svg, &options).map_err(|e| FigureError::Render(e.to_string()))?;
    let size = tree.size().to_int_size();
    let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height())
        .ok_or_else(|| FigureError::Render(format!("an empty image ({}x{})", size.width(), size.height())))?;
    pixmap.fill(tiny_skia::Color::WHITE);
    resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
    pixmap.encode_png().map_err(|e| FigureError::Render(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_band_reads_every_seed_as_a_step_function() {
        let seeds = vec![vec![(0, 0.2), (100, 0.4)], vec![(0, 0.3), (50, 0.1), (120, 0.5)]];
        let band = BandCurve::over_seeds("whale", &seeds);
        let expected = [(0, 0.25, 0.2, 0.3), (50, 0.15, 0.1, 0.2), (100, 0.25, 0.1, 0.4), (120, 0.45, 0.4, 0.5)];
        assert_eq!(band.points.len(), expected.len());
        for (got, want) in band.points.iter().zip(expected) {
            assert_eq!(got.0, want.0);
            for (a, b) in [(got.1, want.1), (got.2, want.2), (got.3, want.3)] {
                assert!((a - b).abs() < 1e-12, "{got:?} vs {want:?}");
            }
        }
        let late = BandCurve::over_seeds("x", &[vec![(0, 0.1)], vec![(10, 0.2)]]);
        assert_eq!(late.points.len(), 1, "a point is drawn only once every seed has a value: {late:?}");
    }

    #[test]
    fn a_forest_plot_renders_to_a_png_of_its_size() {
        let rows = vec![
            ForestRow { label: "weight-only best".into(), value: -0.05, lo: -0.09, hi: -0.01 },
            ForestRow { label: "harness-only best".into(), value: 0.02, lo: -0.03, hi: 0.07 },
        ];
        let svg = forest_svg("math", &rows).expect("svg");
        assert!(svg.contains("weight-only best") && svg.contains("<svg"), "labels are in the SVG");
        let png = png(&svg).expect("png");
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let width = u32::from_be_bytes([png[16], png[17], png[18], png[19]]);
        let height = u32::from_be_bytes([png[20], png[21], png[22], png[23]]);
        assert_eq!((width, height), (900, 120 + 34 * 2));
    }
}
