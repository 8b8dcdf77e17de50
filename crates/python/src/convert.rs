//! JSON values between Python and Rust: `dict`/`list`/`str`/`int`/`float`/`bool`/`None` and
//! `serde_json::Value`, keys in order (the workspace's serde_json preserves it).

use std::fmt::Write as _;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

/// Deeper documents are refused instead of overflowing the stack.
const MAX_DEPTH: usize = 512;

/// A Python object as JSON; the error names the JSON pointer of the first value that is not
/// JSON (`what` says which argument it was).
pub fn to_json(object: &Bound<'_, PyAny>, what: &str) -> PyResult<Value> {
    let mut pointer = String::new();
    convert(object, what, &mut pointer, 0)
}

fn convert(
    object: &Bound<'_, PyAny>,
    what: &str,
    pointer: &mut String,
    depth: usize,
) -> PyResult<Value> {
    if depth > MAX_DEPTH {
        return Err(PyValueError::new_err(format!(
            "{what}: nested deeper than {MAX_DEPTH} levels at {}",
            shown(pointer)
        )));
    }
    if object.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = object.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if let Ok(s) = object.cast::<PyString>() {
        return Ok(Value::String(s.to_cow()?.into_owned()));
    }
    if object.cast::<PyInt>().is_ok() {
        if let Ok(i) = object.extract::<i64>() {
            return Ok(Value::Number(i.into()));
        }
        if let Ok(u) = object.extract::<u64>() {
            return Ok(Value::Number(u.into()));
        }
        return Err(PyValueError::new_err(format!(
            "{what}: the integer at {} does not fit in 64 bits",
            shown(pointer)
        )));
    }
    if let Ok(f) = object.cast::<PyFloat>() {
        let value = f.value();
        return Number::from_f64(value).map(Value::Number).ok_or_else(|| {
            PyValueError::new_err(format!(
                "{what}: {value} at {} is not a JSON number",
                shown(pointer)
            ))
        });
    }
    if let Ok(dict) = object.cast::<PyDict>() {
        let mut map = Map::new();
        for (key, item) in dict.iter() {
            let key = match key.cast::<PyString>() {
                Ok(k) => k.to_cow()?.into_owned(),
                Err(_) => {
                    return Err(PyTypeError::new_err(format!(
                        "{what}: a key at {} is {}, not a string; JSON object keys are strings",
                        shown(pointer),
                        key.get_type().name()?
                    )));
                }
            };
            let len = pointer.len();
            pointer.push('/');
            // The pointer is kept for error messages; escaping allocates only when needed.
            if key.contains(['~', '/']) {
                pointer.push_str(&key.replace('~', "~0").replace('/', "~1"));
            } else {
                pointer.push_str(&key);
            }
            let value = convert(&item, what, pointer, depth + 1)?;
            pointer.truncate(len);
            map.insert(key, value);
        }
        return Ok(Value::Object(map));
    }
    if object.cast::<PyList>().is_ok() || object.cast::<PyTuple>().is_ok() {
        let mut items = Vec::new();
        for (index, item) in object.try_iter()?.enumerate() {
            let len = pointer.len();
            pointer.push('/');
            let _ = write!(pointer, "{index}");
            items.push(convert(&item?, what, pointer, depth + 1)?);
            pointer.truncate(len);
        }
        return Ok(Value::Array(items));
    }
    Err(PyTypeError::new_err(format!(
        "{what}: the value at {} is {}, which is not JSON (use dict, list, str, int, float, bool or None)",
        shown(pointer),
        object.get_type().name()?
    )))
}

fn shown(pointer: &str) -> &str {
    if pointer.is_empty() {
        "the root"
    } else {
        pointer
    }
}

/// A JSON value as a Python object (objects keep their key order).
pub fn to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (key, item) in map {
                dict.set_item(key, to_py(py, item)?)?;
            }
            dict.into_any()
        }
    })
}
