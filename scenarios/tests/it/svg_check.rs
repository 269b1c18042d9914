//! Checks of a timeline SVG: its text labels (read from the XML), and its
//! pixels (rendered with resvg: shapes only, so no font is needed).

#![allow(dead_code, unreachable_pub)]

/// The text of every `<text>` element, in document order.
pub fn texts(svg: &str) -> Vec<String> {
    let document = roxmltree::Document::parse(svg).expect("the SVG is well-formed XML");
    document
        .descendants()
        .filter(|node| node.has_tag_name("text"))
        .map(|node| node.descendants().filter(|n| n.is_text()).filter_map(|n| n.text()).collect())
        .collect()
}

/// What a rendering looks like, counted.
#[derive(Debug, Clone, Copy)]
pub struct Pixels {
    pub width: u32,
    pub height: u32,
    pub total: usize,
    /// Pixels clearly darker than the page and the shaded sections: bars, points, lines.
    pub inked: usize,
    /// Pixels of the red that rings a flagged operation (and a stale write stored).
    pub flag_red: usize,
}

/// Renders `svg` (text elements are skipped: usvg is built without fonts) and counts its pixels.
pub fn render(svg: &str) -> Pixels {
    let tree =
        resvg::usvg::Tree::from_str(svg, &resvg::usvg::Options::default()).expect("usvg parses the SVG");
    let size = tree.size().to_int_size();
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).expect("a non-empty picture");
    resvg::render(&tree, resvg::tiny_skia::Transform::identity(), &mut pixmap.as_mut());
    let pixels = pixmap.pixels();
    // The page is white and the sections' shading lighter than #f0f0f0: neither counts.
    let inked = pixels.iter().filter(|p| p.red().min(p.green()).min(p.blue()) < 230).count();
    let flag_red = pixels.iter().filter(|p| p.red() > 180 && p.green() < 70 && p.blue() < 70).count();
    Pixels { width: size.width(), height: size.height(), total: pixels.len(), inked, flag_red }
}
