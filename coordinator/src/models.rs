//! Model files for the learned placement policies: reading them with errors
//! that name the file, for `serve --model`, `sim --model` and `train`.

use std::path::{Path, PathBuf};

use starling_placement::learned::{ModelError, ModelFile};

/// Why a model file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ModelReadError {
    /// The file could not be read.
    #[error("cannot read model file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS's words.
        source: std::io::Error,
    },
    /// The file is not a model this build can run.
    #[error("model file {path}: {source}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: ModelError,
    },
}

/// Reads and checks a model file.
pub fn read(path: &Path) -> Result<ModelFile, ModelReadError> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelReadError::Io {
        path: path.to_owned(),
        source,
    })?;
    ModelFile::from_json(&text).map_err(|source| ModelReadError::Invalid {
        path: path.to_owned(),
        source,
    })
}
