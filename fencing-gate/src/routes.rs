//! Which requests are fenced and by what key: the `[[route]]` table.
//!
//! Paths are matched after percent-decoding (the proxy refuses paths that
//! decode to something ambiguous first: `forward::canonical_path`), so that two
//! spellings of one path meet one route and one key. A request no route
//! matches is fenced by `[fencing] methods`, keyed by its path.

use std::borrow::Cow;
use std::sync::Arc;

use fencing_layer::key::{KeyExtractor, KeyRequest};
use http::{HeaderName, Method, Request};

use crate::config::{ConfigError, Route};

/// The routes, ready to match.
#[derive(Debug)]
pub(crate) struct Routes {
    router: matchit::Router<usize>,
    rules: Vec<Rule>,
}

#[derive(Debug)]
struct Rule {
    fenced: bool,
    methods: Option<Vec<Method>>,
    key: Key,
}

#[derive(Debug)]
enum Key {
    Path,
    Template(Vec<Piece>),
    Header(HeaderName),
}

#[derive(Debug)]
enum Piece {
    Text(String),
    Param(String),
}

impl Routes {
    pub(crate) fn new(routes: &[Route]) -> Result<Self, ConfigError> {
        let mut router = matchit::Router::new();
        let mut rules = Vec::with_capacity(routes.len());
        for (index, route) in routes.iter().enumerate() {
            let at = |why: String| ConfigError::at_route(index, &route.path, why);
            router.insert(route.path.clone(), index).map_err(|e| at(e.to_string()))?;
            let params = params_of(&route.path);
            let key = match (&route.key, &route.key_header) {
                (Some(_), Some(_)) => return Err(at("give `key` or `key_header`, not both".into())),
                (None, None) => Key::Path,
                (Some(template), None) => Key::Template(template_pieces(template, &params).map_err(at)?),
                (None, Some(header)) => Key::Header(
                    HeaderName::try_from(header)
                        .map_err(|_| at(format!("`{header}` is not a header name")))?,
                ),
            };
            rules.push(Rule { fenced: route.fenced, methods: route.methods.clone(), key });
        }
        Ok(Self { router, rules })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    fn rule<'p>(&self, path: &'p str) -> Option<(&Rule, matchit::Params<'_, 'p>)> {
        let matched = self.router.at(path).ok()?;
        Some((&self.rules[*matched.value], matched.params))
    }
}

/// The names in a path template: `{id}` and `{*rest}`.
fn params_of(path: &str) -> Vec<String> {
    path.split('{')
        .skip(1)
        .filter_map(|part| part.split_once('}'))
        .map(|(name, _)| name.trim_start_matches('*').to_owned())
        .collect()
}

fn template_pieces(template: &str, params: &[String]) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else {
            return Err(format!("key `{template}`: `{{` without `}}`"));
        };
        let name = &rest[open + 1..open + close];
        if !params.iter().any(|p| p == name) {
            return Err(format!("key `{template}`: the path has no parameter `{name}`"));
        }
        if open > 0 {
            pieces.push(Piece::Text(rest[..open].to_owned()));
        }
        pieces.push(Piece::Param(name.to_owned()));
        rest = &rest[open + close + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest.to_owned()));
    }
    Ok(pieces)
}

/// The layer's view of the routes: whether a request passes unfenced, and its key.
#[derive(Debug, Clone)]
pub(crate) struct RouteKeys {
    routes: Arc<Routes>,
    /// The methods fenced where a route does not say (`None`: all but the safe ones).
    methods: Option<Arc<[Method]>>,
}

impl RouteKeys {
    pub(crate) fn new(routes: Routes, methods: Option<Vec<Method>>) -> Self {
        Self { routes: Arc::new(routes), methods: methods.map(Into::into) }
    }

    /// Whether `request` passes through unfenced.
    pub(crate) fn unfenced(&self, request: &dyn KeyRequest) -> bool {
        let method = request.method();
        let path = decoded(request.path());
        match self.routes.rule(&path) {
            None => !fences(self.methods.as_deref(), method),
            Some((rule, _)) => {
                !rule.fenced || !fences(rule.methods.as_deref().or(self.methods.as_deref()), method)
            }
        }
    }
}

/// Whether `methods` (`None`: every method but GET, HEAD, OPTIONS, TRACE) fences `method`.
fn fences(methods: Option<&[Method]>, method: &Method) -> bool {
    match methods {
        Some(methods) => methods.contains(method),
        None => !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE),
    }
}

impl<B> KeyExtractor<B> for RouteKeys {
    fn extract<'r>(&self, request: &'r Request<B>) -> Option<Cow<'r, str>> {
        let path = decoded(request.uri().path());
        if self.routes.is_empty() {
            return Some(path);
        }
        let Some((rule, params)) = self.routes.rule(&path) else { return Some(path) };
        match &rule.key {
            Key::Path => Some(Cow::Owned(path.to_string())),
            Key::Header(name) => request.header(name.as_str()).map(|value| Cow::Owned(value.to_owned())),
            Key::Template(pieces) => {
                let mut key = String::new();
                for piece in pieces {
                    match piece {
                        Piece::Text(text) => key.push_str(text),
                        Piece::Param(name) => key.push_str(params.get(name)?),
                    }
                }
                Some(Cow::Owned(key))
            }
        }
    }

    fn missing(&self, request: &Request<B>) -> Cow<'static, str> {
        match self.routes.rule(&decoded(request.uri().path())) {
            Some((Rule { key: Key::Header(name), .. }, _)) => {
                Cow::Owned(format!("this route is keyed by the `{name}` header: send it once, visible ASCII"))
            }
            _ => Cow::Borrowed("the path does not percent-decode to UTF-8"),
        }
    }
}

/// The percent-decoded path (checked to be UTF-8 before the layer sees it).
fn decoded(path: &str) -> Cow<'_, str> {
    crate::forward::decode_path(path).unwrap_or(Cow::Borrowed(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(routes: &[(&str, Option<&str>)]) -> RouteKeys {
        let routes: Vec<Route> = routes
            .iter()
            .map(|(path, key)| {
                let text = match key {
                    Some(key) => format!("path = {path:?}\nkey = {key:?}"),
                    None => format!("path = {path:?}\nfenced = false"),
                };
                toml::from_str(&text).unwrap()
            })
            .collect();
        RouteKeys::new(Routes::new(&routes).unwrap(), Some(vec![Method::POST, Method::PUT]))
    }

    fn key(keys: &RouteKeys, method: &str, path: &str) -> Option<String> {
        let request = Request::builder().method(method).uri(path).body(()).unwrap();
        if keys.unfenced(&request) {
            return None;
        }
        Some(keys.extract(&request).unwrap().into_owned())
    }

    #[test]
    fn templates_key_by_parameters_and_other_paths_by_path() {
        let keys = keys(&[("/accounts/{id}/ledger/{*rest}", Some("account:{id}")), ("/health", None)]);
        assert_eq!(key(&keys, "POST", "/accounts/7/ledger/2024/01").as_deref(), Some("account:7"));
        // Spelt with escapes, the same route and key.
        assert_eq!(key(&keys, "POST", "/accounts/%37/led%67er/x").as_deref(), Some("account:7"));
        assert_eq!(key(&keys, "PUT", "/other").as_deref(), Some("/other"));
        assert_eq!(key(&keys, "GET", "/accounts/7/ledger/x"), None);
        assert_eq!(key(&keys, "DELETE", "/other"), None, "not among the fenced methods");
        assert_eq!(key(&keys, "POST", "/health"), None, "a pass-through route");
    }

    #[test]
    fn a_template_naming_a_missing_parameter_is_refused() {
        let route: Route = toml::from_str("path = \"/a/{id}\"\nkey = \"x:{ide}\"").unwrap();
        let error = Routes::new(&[route]).unwrap_err().to_string();
        assert!(error.contains("no parameter `ide`"), "{error}");
    }
}
