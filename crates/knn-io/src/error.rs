//! The crate's error types.

/// Everything that can go wrong reading or writing a table.
///
/// Every message starts with the file name the caller gave (the path, or `name_for_errors`
/// for the `*_from_bytes` readers) and then says where: `record R at byte B` for fvecs, ivecs
/// and bvecs (records and bytes counted from 0), `element [i, j] at byte B` for npy (numpy
/// indices), `line L, column C` for CSV (both counted from 1, as editors do).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IoError {
    /// The operating system refused an open, read, write or rename.
    #[error("{file}: {error}")]
    Io {
        /// The file the operation was on.
        file: String,
        /// What the operating system said.
        error: std::io::Error,
    },
    /// No [`Format`](crate::Format) was given and the file name's extension names none.
    #[error(
        "{file}: cannot tell the format from the file name (known extensions: .fvecs .ivecs \
         .bvecs .npy .csv .txt .tsv .hdf5 .h5); name the format explicitly"
    )]
    UnknownFormat {
        /// The file whose extension was not recognised.
        file: String,
    },
    /// The contents are malformed, or hold values the requested type cannot represent, or the
    /// table cannot be stored in the requested format. `message` says what and where.
    #[error("{file}: {message}")]
    Invalid {
        /// The file the problem is in.
        file: String,
        /// What is wrong, and where (record and byte, element, or line and column).
        message: String,
    },
}

impl IoError {
    /// The file name this error is about, as the caller gave it.
    pub fn file(&self) -> &str {
        match self {
            IoError::Io { file, .. }
            | IoError::UnknownFormat { file }
            | IoError::Invalid { file, .. } => file,
        }
    }

    pub(crate) fn invalid(file: &str, message: impl Into<String>) -> IoError {
        IoError::Invalid {
            file: file.to_owned(),
            message: message.into(),
        }
    }

    pub(crate) fn io(file: &str, error: std::io::Error) -> IoError {
        IoError::Io {
            file: file.to_owned(),
            error,
        }
    }
}

/// A `--format` value that names no [`Format`](crate::Format).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseFormatError {
    /// The text that was given.
    pub given: String,
}

impl std::fmt::Display for ParseFormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let given = &self.given;
        write!(
            f,
            "unknown format '{given}' (expected one of: fvecs, ivecs, bvecs, npy, csv)"
        )?;
        if ["hdf5", "h5", "he5"].contains(&given.trim().to_ascii_lowercase().as_str()) {
            // HDF5 is read only, and known without being named.
            write!(
                f,
                "; an HDF5 input needs no format: it is known by its .hdf5 or .h5 name or its \
                 first bytes (name a dataset as FILE:NAME), and results cannot be written as HDF5"
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for ParseFormatError {}
