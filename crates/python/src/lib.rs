//! The skillstate runtime as a native Python module (`skillstate._native`, re-exported by the
//! `skillstate` package): load skills, validate answers and render prompts with the runtime's
//! own pipeline, and run skills as durable tasks with Python callables as the model and tools.

mod callables;
mod convert;
mod errors;
mod runtime;
mod skill;
mod upgrade;

use pyo3::prelude::*;

/// o200k_base tokens of `text`: the count every budget and prompt figure of skillstate uses.
#[pyfunction]
fn count_tokens(py: Python<'_>, text: &str) -> usize {
    py.detach(|| skillstate_core::count_tokens(text))
}

#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<skill::PySkill>()?;
    m.add_class::<skill::PyVerdict>()?;
    m.add_class::<callables::PyTool>()?;
    m.add_class::<callables::PyModelRequest>()?;
    m.add_class::<runtime::PyRuntime>()?;
    m.add_class::<runtime::Task>()?;
    m.add_function(wrap_pyfunction!(count_tokens, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    Ok(())
}
