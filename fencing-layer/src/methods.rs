//! [`MethodSet`]: which methods pass through unfenced, checked on every request.

use std::fmt;

use http::Method;

/// A set of HTTP methods: a bit for each standard method, so the per-request
/// check is one match and a mask, and a list for extension methods.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct MethodSet {
    standard: u16,
    extension: Vec<Method>,
}

impl MethodSet {
    fn bit(method: &Method) -> Option<u16> {
        let index = match *method {
            Method::GET => 0,
            Method::HEAD => 1,
            Method::OPTIONS => 2,
            Method::TRACE => 3,
            Method::POST => 4,
            Method::PUT => 5,
            Method::PATCH => 6,
            Method::DELETE => 7,
            Method::CONNECT => 8,
            _ => return None,
        };
        Some(1 << index)
    }

    #[inline]
    pub(crate) fn contains(&self, method: &Method) -> bool {
        match Self::bit(method) {
            Some(bit) => self.standard & bit != 0,
            None => self.extension.contains(method),
        }
    }
}

const STANDARD: [Method; 9] = [
    Method::GET,
    Method::HEAD,
    Method::OPTIONS,
    Method::TRACE,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
    Method::CONNECT,
];

impl fmt::Debug for MethodSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let standard = STANDARD.iter().filter(|method| self.contains(method));
        f.debug_set().entries(standard.chain(&self.extension)).finish()
    }
}

impl FromIterator<Method> for MethodSet {
    fn from_iter<I: IntoIterator<Item = Method>>(methods: I) -> Self {
        let mut set = Self::default();
        for method in methods {
            match Self::bit(&method) {
                Some(bit) => set.standard |= bit,
                None if !set.extension.contains(&method) => set.extension.push(method),
                None => {}
            }
        }
        set
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_a_list_of_the_same_methods() {
        let all =
            ["GET", "HEAD", "OPTIONS", "TRACE", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "PURGE", "LOCK"]
                .map(|name| Method::from_bytes(name.as_bytes()).unwrap());
        // Every subset of the eleven, standard and extension methods mixed.
        for mask in 0u32..(1 << all.len()) {
            let chosen: Vec<Method> = all
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, m)| m.clone())
                .collect();
            let set: MethodSet = chosen.iter().cloned().collect();
            for method in &all {
                assert_eq!(set.contains(method), chosen.contains(method), "{method} in {chosen:?}");
            }
            assert_eq!(format!("{set:?}").matches(',').count() + 1, chosen.len().max(1));
        }
    }
}
