//! A small timeline picture of a history, as a self-contained SVG: one lane per
//! actor, bars for spans (a lease, a pause, a write inside the handler), points
//! for events (a grant, a write and its outcome), sections for the phases of a
//! run, and a time axis annotated with the recorded times.
//!
//! Positions come from the recorded times, but the layout does not depend on
//! timing noise: consecutive instants are kept at least [`Scale::min_gap`]
//! apart (events a millisecond apart stay readable) and at most
//! [`Scale::max_gap`] (a long wait does not push the rest off the page), and
//! labels that would overlap go to another row of their lane.
//!
//! ```
//! use std::time::Duration;
//! use scenarios::timeline::{BarKind, Timeline, Tone};
//!
//! let ms = Duration::from_millis;
//! let mut timeline = Timeline::new("two writes");
//! let a = timeline.lane("client A");
//! timeline.bar(a, ms(0), ms(200), BarKind::Lease, "lease, token 3");
//! timeline.point(a, ms(250), Tone::Refused, "token 3 → 409");
//! let svg = timeline.to_svg();
//! assert!(svg.starts_with("<svg") && svg.contains("token 3 → 409"));
//! ```

mod layout;
mod record;
mod svg;

use std::collections::BTreeMap;
use std::time::Duration;

pub use record::Recorded;
pub(crate) use record::Recorder;

/// A lane (one actor's row), as returned by [`Timeline::lane`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lane(usize);

/// What a bar stands for; each kind has its own colour and slot in the lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum BarKind {
    /// A lease, from its grant to its expiry or release (the lane's upper slot).
    Lease,
    /// The holder is paused: it runs nothing, keepalives included.
    Pause,
    /// A write admitted and inside the handler.
    Inside,
    /// A write held at the door (the layer) until an older one has left.
    Waiting,
    /// A request on the wire, held or slow, before it reached the server.
    OnTheWire,
    /// The resource's fencing mark, from the moment it was seen.
    Mark,
    /// No fencing: the resource keeps no mark.
    NoMark,
    /// A fault: a crash (the server down) or a partition.
    Fault,
}

/// The colour of a point: what happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tone {
    /// A write stored as it should be.
    Stored,
    /// A stale write stored after a newer one: the failure fencing prevents.
    StaleStored,
    /// A write refused (409, or another refusal: nothing applied).
    Refused,
    /// A write stored after waiting at the door.
    Waited,
    /// No answer: the write may or may not have been applied.
    Unknown,
    /// The lock service's doing: a grant, a release.
    Lock,
    /// Something ended or was observed: an expiry, a restart.
    Neutral,
}

#[derive(Debug, Clone)]
struct Bar {
    lane: Lane,
    from: Duration,
    to: Duration,
    kind: BarKind,
    label: String,
}

/// An event on a lane; [`Point::flag`] marks it as one the checker flags.
#[derive(Debug, Clone)]
pub struct Point {
    lane: Lane,
    at: Duration,
    tone: Tone,
    label: String,
    flag: Option<String>,
}

impl Point {
    /// Marks the event as flagged (a red ring), with `why` under its label.
    pub fn flag(&mut self, why: impl Into<String>) -> &mut Self {
        self.flag = Some(why.into());
        self
    }
}

#[derive(Debug, Clone)]
struct Section {
    from: Duration,
    to: Duration,
    heading: String,
}

/// How recorded time becomes horizontal distance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scale {
    /// Pixels per millisecond between two instants, before the bounds below.
    pub px_per_ms: f64,
    /// The least distance between two distinct instants: jitter never overlaps them.
    pub min_gap: f64,
    /// The most: a longer gap is drawn broken (`≈` on the axis).
    pub max_gap: f64,
}

impl Default for Scale {
    /// For a run of a second or so whose events come in bursts.
    fn default() -> Self {
        Self { px_per_ms: 0.8, min_gap: 32.0, max_gap: 150.0 }
    }
}

/// A timeline being drawn: lanes top to bottom in the order they were added.
#[derive(Debug, Clone)]
pub struct Timeline {
    title: String,
    captions: Vec<String>,
    lanes: Vec<String>,
    sections: Vec<Section>,
    bars: Vec<Bar>,
    points: Vec<Point>,
    scale: Scale,
    /// The legend's words where they are not the defaults.
    words: Words,
}

/// Legend words that replace the defaults.
#[derive(Debug, Clone, Default)]
struct Words {
    bars: BTreeMap<BarKind, String>,
    tones: BTreeMap<Tone, String>,
    flag: Option<String>,
}

impl Timeline {
    /// An empty timeline under `title`.
    pub fn new(title: impl Into<String>) -> Self {
        Self {
            title: title.into(),
            captions: Vec::new(),
            lanes: Vec::new(),
            sections: Vec::new(),
            bars: Vec::new(),
            points: Vec::new(),
            scale: Scale::default(),
            words: Words::default(),
        }
    }

    /// A line of text under the title.
    pub fn caption(&mut self, line: impl Into<String>) -> &mut Self {
        self.captions.push(line.into());
        self
    }

    /// How time becomes distance (default: [`Scale::default`]).
    pub fn scale(&mut self, scale: Scale) -> &mut Self {
        self.scale = scale;
        self
    }

    /// The legend's words for bars of `kind`, instead of the default ones
    /// (which speak of a fenced resource: "the resource's mark").
    pub fn bar_legend(&mut self, kind: BarKind, words: impl Into<String>) -> &mut Self {
        self.words.bars.insert(kind, words.into());
        self
    }

    /// The legend's words for points of `tone`, instead of the default ones.
    pub fn tone_legend(&mut self, tone: Tone, words: impl Into<String>) -> &mut Self {
        self.words.tones.insert(tone, words.into());
        self
    }

    /// The legend's words for flagged points, instead of "flagged by the checker".
    pub fn flag_legend(&mut self, words: impl Into<String>) -> &mut Self {
        self.words.flag = Some(words.into());
        self
    }

    /// Adds a lane named `name` below the others.
    pub fn lane(&mut self, name: impl Into<String>) -> Lane {
        self.lanes.push(name.into());
        Lane(self.lanes.len() - 1)
    }

    /// A phase of the run, shaded behind every lane, `heading` on top.
    pub fn section(&mut self, from: Duration, to: Duration, heading: impl Into<String>) {
        self.sections.push(Section { from, to: to.max(from), heading: heading.into() });
    }

    /// A span on `lane` from `from` to `to`, with `label` inside it (or beside it when it does not fit).
    pub fn bar(&mut self, lane: Lane, from: Duration, to: Duration, kind: BarKind, label: impl Into<String>) {
        self.bars.push(Bar { lane, from, to: to.max(from), kind, label: label.into() });
    }

    /// An event on `lane` at `at`, with `label` under it.
    pub fn point(&mut self, lane: Lane, at: Duration, tone: Tone, label: impl Into<String>) -> &mut Point {
        self.points.push(Point { lane, at, tone, label: label.into(), flag: None });
        self.points.last_mut().expect("just pushed")
    }

    /// The picture, as a standalone SVG document (fonts: the generic families).
    pub fn to_svg(&self) -> String {
        svg::render(self, &layout::Layout::of(self, svg::legend_width(self)))
    }
}
