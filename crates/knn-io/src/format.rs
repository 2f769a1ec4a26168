//! Which file format a path holds.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use crate::error::{IoError, ParseFormatError};

/// The file formats this crate reads and writes. See the crate docs for each layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// Records of a little-endian `i32` dimension `d` followed by `d` little-endian `f32`.
    Fvecs,
    /// Records of a little-endian `i32` dimension `d` followed by `d` little-endian `i32`.
    Ivecs,
    /// Records of a little-endian `i32` dimension `d` followed by `d` bytes (`u8`).
    Bvecs,
    /// NumPy `.npy` array file, format versions 1.0, 2.0 and 3.0, 1-D or 2-D.
    Npy,
    /// Numbers separated by commas, tabs, semicolons or spaces, one row per line, optional
    /// header line.
    Csv,
}

impl Format {
    /// Every format, in the order the docs list them.
    pub const ALL: [Format; 5] = [
        Format::Fvecs,
        Format::Ivecs,
        Format::Bvecs,
        Format::Npy,
        Format::Csv,
    ];

    /// The format named by the file's extension: `.fvecs`, `.ivecs`, `.bvecs`, `.npy`, `.csv`,
    /// or `.txt` and `.tsv` (read as CSV, the delimiter found from the lines); case does not
    /// matter. Any other extension, or none, is
    /// [`IoError::UnknownFormat`] naming the path.
    pub fn from_path(path: &Path) -> Result<Format, IoError> {
        path.extension()
            .and_then(|ext| ext.to_str())
            .and_then(Format::from_name)
            .ok_or_else(|| IoError::UnknownFormat {
                file: path.display().to_string(),
            })
    }

    /// The lowercase name used by `FromStr`, `Display` and the file extension.
    pub fn name(self) -> &'static str {
        match self {
            Format::Fvecs => "fvecs",
            Format::Ivecs => "ivecs",
            Format::Bvecs => "bvecs",
            Format::Npy => "npy",
            Format::Csv => "csv",
        }
    }

    fn from_name(s: &str) -> Option<Format> {
        let lower = s.trim().to_ascii_lowercase();
        match lower.as_str() {
            "fvecs" => Some(Format::Fvecs),
            "ivecs" => Some(Format::Ivecs),
            "bvecs" => Some(Format::Bvecs),
            "npy" => Some(Format::Npy),
            "csv" | "txt" | "tsv" => Some(Format::Csv),
            _ => None,
        }
    }
}

impl FromStr for Format {
    type Err = ParseFormatError;

    /// Parses `fvecs`, `ivecs`, `bvecs`, `npy` or `csv` (any case; `txt` also means CSV), as
    /// given to a `--format` override.
    fn from_str(s: &str) -> Result<Format, ParseFormatError> {
        Format::from_name(s).ok_or_else(|| ParseFormatError {
            given: s.to_owned(),
        })
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
