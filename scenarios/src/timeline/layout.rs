//! Where everything goes: instants to x, lanes to y, labels to rows that do not
//! overlap. Pure arithmetic on the timeline; `svg.rs` only draws the result.

use std::time::Duration;

use super::{BarKind, Timeline};

/// Left margin: the lane names.
pub(super) const LEFT: f64 = 128.0;
/// Right margin past the last instant or label.
const RIGHT: f64 = 24.0;
/// A lane's track: a lease slot on top, an activity slot under it.
pub(super) const TRACK: f64 = 34.0;
/// One row of labels under a track.
pub(super) const ROW: f64 = 14.0;
/// Space between lanes.
const LANE_GAP: f64 = 8.0;
/// Width of one character of the monospace labels (10.5 px font: 0.6 em, rounded up).
pub(super) const CHAR: f64 = 6.4;
/// Least space between two labels in one row.
const PAD: f64 = 8.0;
/// Title and caption lines.
pub(super) const TITLE: f64 = 30.0;
pub(super) const CAPTION: f64 = 17.0;
/// The row of section headings above the lanes.
pub(super) const HEADINGS: f64 = 26.0;
/// The axis: ticks and two rows of time labels.
pub(super) const AXIS: f64 = 46.0;
/// The legend row.
pub(super) const LEGEND: f64 = 34.0;

/// The width of `text` in the labels' font.
pub(super) fn text_width(text: &str) -> f64 {
    text.chars().count() as f64 * CHAR
}

/// Where a label is drawn: `x` is its left edge, `y` its baseline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Placed {
    pub x: f64,
    pub y: f64,
    /// Inside its bar (drawn over the bar's colour) rather than in a row.
    pub inside: bool,
}

/// A lane's vertical extent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct LaneBox {
    /// Top of the track.
    pub y: f64,
    /// Track and label rows.
    pub height: f64,
}

pub(super) struct Layout {
    /// Every instant of the timeline, in order, with its x.
    instants: Vec<(Duration, f64)>,
    /// The x of the middle of each gap drawn shorter than it is.
    pub breaks: Vec<f64>,
    pub lanes: Vec<LaneBox>,
    /// Per bar (same order as the timeline's): where its label goes.
    pub bar_labels: Vec<Placed>,
    /// Per point: its label, and its flag's reason if flagged.
    pub point_labels: Vec<(Placed, Option<Placed>)>,
    /// Time labels on the axis: left edge, row (0 or 1), text.
    pub axis_labels: Vec<(f64, usize, String)>,
    /// Top of the first lane.
    pub lanes_top: f64,
    /// The axis line.
    pub axis_y: f64,
    pub width: f64,
    pub height: f64,
}

/// Rows of labels in which nothing overlaps.
#[derive(Default)]
struct Rows(Vec<Vec<(f64, f64)>>);

impl Rows {
    /// The first row in which `[left, right)` is free (a new row if none), taken.
    fn take(&mut self, left: f64, right: f64) -> usize {
        let free = |row: &Vec<(f64, f64)>| row.iter().all(|&(l, r)| right + PAD <= l || r + PAD <= left);
        let index = self.0.iter().position(free).unwrap_or_else(|| {
            self.0.push(Vec::new());
            self.0.len() - 1
        });
        self.0[index].push((left, right));
        index
    }

    /// As `take`, but only within the first `max` rows.
    fn take_within(&mut self, left: f64, right: f64, max: usize) -> Option<usize> {
        let row = self.take(left, right);
        if row < max {
            return Some(row);
        }
        self.0.truncate(max);
        None
    }
}

impl Layout {
    /// Where everything of `timeline` goes; the picture is at least as wide as
    /// its legend, `legend_right` (the renderer's to measure, as it draws it).
    pub(super) fn of(timeline: &Timeline, legend_right: f64) -> Self {
        let (instants, breaks) = place_instants(timeline);
        let x_of = |at: Duration| {
            let index = instants.partition_point(|&(t, _)| t < at);
            instants.get(index).map_or(LEFT, |&(_, x)| x)
        };

        // Labels, lane by lane, in time order so the picture does not depend on insertion order.
        let mut rows: Vec<Rows> = timeline.lanes.iter().map(|_| Rows::default()).collect();
        let mut bar_rows = Vec::new();
        let mut point_rows = Vec::new();
        let mut order: Vec<(f64, bool, usize)> = Vec::new();
        order.extend(timeline.bars.iter().enumerate().map(|(i, bar)| (x_of(bar.from), true, i)));
        order.extend(timeline.points.iter().enumerate().map(|(i, point)| (x_of(point.at), false, i)));
        order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        bar_rows.resize(timeline.bars.len(), (0.0, None));
        point_rows.resize(timeline.points.len(), (0.0, 0, None));
        for (x, is_bar, index) in order {
            if is_bar {
                let bar = &timeline.bars[index];
                let width = x_of(bar.to) - x;
                let text = text_width(&bar.label);
                if bar.label.is_empty() || text + 8.0 <= width {
                    bar_rows[index] = (x + 4.0, None);
                } else {
                    let row = rows[bar.lane.0].take(x, x + text);
                    bar_rows[index] = (x, Some(row));
                }
            } else {
                let point = &timeline.points[index];
                let text = text_width(&point.label);
                let left = (x - text / 2.0).max(LEFT);
                // An unlabelled point takes no row.
                let row = if point.label.is_empty() { 0 } else { rows[point.lane.0].take(left, left + text) };
                let flag = point.flag.as_ref().map(|why| {
                    let text = text_width(why);
                    let left = (x - text / 2.0).max(LEFT);
                    (left, rows[point.lane.0].take(left, left + text))
                });
                point_rows[index] = (left, row, flag);
            }
        }

        // Lanes, top to bottom.
        let lanes_top = TITLE + CAPTION * timeline.captions.len() as f64 + HEADINGS;
        let mut y = lanes_top;
        let lanes: Vec<LaneBox> = rows
            .iter()
            .map(|rows| {
                let lane = LaneBox { y, height: TRACK + ROW * rows.0.len() as f64 + 4.0 };
                y += lane.height + LANE_GAP;
                lane
            })
            .collect();
        let axis_y = y + 4.0;
        let row_y = |lane: usize, row: usize| lanes[lane].y + TRACK + ROW * (row as f64 + 1.0) - 3.0;

        let bar_labels = timeline
            .bars
            .iter()
            .zip(&bar_rows)
            .map(|(bar, &(x, row))| match row {
                None => Placed { x, y: slot_baseline(lanes[bar.lane.0].y, bar.kind), inside: true },
                Some(row) => Placed { x, y: row_y(bar.lane.0, row), inside: false },
            })
            .collect();
        let point_labels = timeline
            .points
            .iter()
            .zip(&point_rows)
            .map(|(point, &(x, row, flag))| {
                let placed = Placed { x, y: row_y(point.lane.0, row), inside: false };
                let flag = flag.map(|(x, row)| Placed { x, y: row_y(point.lane.0, row), inside: false });
                (placed, flag)
            })
            .collect();

        // Time labels under the axis, in two rows; one that fits in neither is left out.
        let total = instants.last().map_or(Duration::ZERO, |&(t, _)| t);
        let mut axis_rows = Rows::default();
        let mut axis_labels = Vec::new();
        let mut last_text = String::new();
        for &(at, x) in &instants {
            let text = time_label(at, total);
            // Instants within the same millisecond share one label.
            if text == last_text {
                continue;
            }
            last_text.clone_from(&text);
            let width = text_width(&text);
            let left = (x - width / 2.0).max(LEFT - 20.0);
            if let Some(row) = axis_rows.take_within(left, left + width, 2) {
                axis_labels.push((left, row, text));
            }
        }

        let last_x = instants.last().map_or(LEFT, |&(_, x)| x);
        let label_right = rows.iter().flat_map(|r| r.0.iter().flatten()).map(|&(_, r)| r);
        let title_right = LEFT + text_width(&timeline.title);
        let caption_right = timeline.captions.iter().map(|c| 16.0 + text_width(c));
        let widest = last_x.max(title_right).max(legend_right);
        let width = label_right.chain(caption_right).fold(widest, f64::max) + RIGHT;
        let height = axis_y + AXIS + LEGEND;
        Self {
            instants,
            breaks,
            lanes,
            bar_labels,
            point_labels,
            axis_labels,
            lanes_top,
            axis_y,
            width: width.ceil(),
            height: height.ceil(),
        }
    }

    /// The x of a recorded instant.
    pub(super) fn x(&self, at: Duration) -> f64 {
        let index = self.instants.partition_point(|&(t, _)| t < at);
        self.instants.get(index).map_or(LEFT, |&(_, x)| x)
    }

    /// Every instant's x (the axis ticks).
    pub(super) fn ticks(&self) -> impl Iterator<Item = f64> + '_ {
        self.instants.iter().map(|&(_, x)| x)
    }
}

/// Distinct instants in order, spaced by the scale within its bounds, and the
/// gaps drawn shorter than they are.
fn place_instants(timeline: &Timeline) -> (Vec<(Duration, f64)>, Vec<f64>) {
    let mut times: Vec<Duration> = Vec::new();
    times.extend(timeline.bars.iter().flat_map(|bar| [bar.from, bar.to]));
    times.extend(timeline.points.iter().map(|point| point.at));
    times.extend(timeline.sections.iter().flat_map(|section| [section.from, section.to]));
    times.sort();
    times.dedup();
    let scale = timeline.scale;
    let mut instants = Vec::with_capacity(times.len());
    let mut breaks = Vec::new();
    let mut previous: Option<(Duration, f64)> = None;
    for at in times {
        let x = match previous {
            None => LEFT + 16.0,
            Some((before, x)) => {
                let wanted = (at - before).as_secs_f64() * 1000.0 * scale.px_per_ms;
                if wanted > scale.max_gap {
                    breaks.push(x + scale.max_gap / 2.0);
                }
                x + wanted.clamp(scale.min_gap, scale.max_gap)
            }
        };
        instants.push((at, x));
        previous = Some((at, x));
    }
    (instants, breaks)
}

/// The baseline of a label drawn inside a bar of `kind` on a track whose top is `top`.
fn slot_baseline(top: f64, kind: BarKind) -> f64 {
    let (slot_top, slot_height) = slot(kind);
    top + slot_top + slot_height - 3.5
}

/// A bar's vertical slot in its track: `(offset from the track's top, height)`.
pub(super) fn slot(kind: BarKind) -> (f64, f64) {
    match kind {
        BarKind::Lease | BarKind::Mark | BarKind::NoMark | BarKind::Fault => (2.0, 14.0),
        BarKind::Pause | BarKind::Inside | BarKind::Waiting | BarKind::OnTheWire => (18.0, 14.0),
    }
}

/// The y of the points on a track whose top is `top`: the middle of the activity slot.
pub(super) fn point_y(top: f64) -> f64 {
    top + 25.0
}

/// `at` as the axis shows it: milliseconds for a short run, seconds for a long one.
fn time_label(at: Duration, total: Duration) -> String {
    if total > Duration::from_secs(3) {
        format!("{:.2} s", at.as_secs_f64())
    } else {
        format!("{} ms", at.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Layout, text_width};
    use crate::timeline::svg::legend_width;
    use crate::timeline::{BarKind, Scale, Timeline, Tone};

    /// The layout as the renderer makes it.
    fn of(timeline: &Timeline) -> Layout {
        Layout::of(timeline, legend_width(timeline))
    }

    /// A lease, then writes `offsets_us` microseconds after it, each with a long label.
    fn burst(offsets_us: &[u64]) -> Timeline {
        let mut timeline = Timeline::new("burst");
        let lane = timeline.lane("client");
        timeline.bar(lane, Duration::ZERO, Duration::from_millis(100), BarKind::Lease, "lease, token 1");
        for (i, &offset) in offsets_us.iter().enumerate() {
            let at = Duration::from_millis(100) + Duration::from_micros(offset);
            timeline.point(lane, at, Tone::Stored, format!("write {i}, token 1 → 201 stored"));
        }
        timeline
    }

    #[test]
    fn crowded_instants_keep_the_least_gap_and_a_long_one_is_shortened() {
        let timeline = burst(&[0, 1_000, 2_000, 2_000_000]);
        let layout = of(&timeline);
        let xs: Vec<f64> = layout.ticks().collect();
        let gaps: Vec<f64> = xs.windows(2).map(|pair| pair[1] - pair[0]).collect();
        let scale = Scale::default();
        assert_eq!(gaps.len(), 4);
        assert!(gaps[0] > scale.min_gap && gaps[0] <= scale.max_gap, "{gaps:?}");
        assert_eq!(&gaps[1..3], &[scale.min_gap, scale.min_gap]);
        assert_eq!(gaps[3], scale.max_gap);
        assert_eq!(layout.breaks.len(), 1);
    }

    #[test]
    fn jitter_within_a_burst_does_not_move_anything() {
        let steady = of(&burst(&[0, 1_000, 2_000, 3_000]));
        let jittery = of(&burst(&[0, 1_400, 2_100, 3_900]));
        assert_eq!(steady.ticks().collect::<Vec<_>>(), jittery.ticks().collect::<Vec<_>>());
        assert_eq!(steady.point_labels, jittery.point_labels);
        assert_eq!((steady.width, steady.height), (jittery.width, jittery.height));
    }

    #[test]
    fn labels_in_one_row_never_overlap() {
        let timeline = burst(&(0..40).map(|i| i * 10).collect::<Vec<_>>());
        let layout = of(&timeline);
        let extents: Vec<(f64, f64, f64)> = timeline
            .points
            .iter()
            .zip(&layout.point_labels)
            .map(|(point, (placed, _))| (placed.y, placed.x, placed.x + text_width(&point.label)))
            .collect();
        for (i, a) in extents.iter().enumerate() {
            for b in &extents[i + 1..] {
                assert!(a.0 != b.0 || a.2 <= b.1 || b.2 <= a.1, "{a:?} overlaps {b:?}");
            }
        }
        // Forty long labels 30 px apart need several rows, and the lane grew to hold them.
        assert!(layout.lanes[0].height > super::TRACK + 4.0 * super::ROW, "{:?}", layout.lanes[0]);
    }
}
