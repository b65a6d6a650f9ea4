//! Output files are written beside their destination and renamed into place (a reader never
//! sees half a file). The rename replaces whatever the path held, so a destination that exists
//! and is not a regular file is refused first: as root, `-o /dev/null` replaced the device with
//! a regular file (and left `/dev/null.partial` beside it), found by the args fuzz target.

use std::path::Path;

/// Ok when `path` does not exist or is a regular file (or a link to one).
pub fn check_destination(path: &Path) -> std::io::Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{}: exists and is not a regular file (a folder or a device): not replaced", path.display()),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_folders_are_refused_files_and_new_paths_are_not() {
        let d = tempfile::tempdir().expect("tempdir");
        assert!(check_destination(Path::new("/dev/null")).is_err());
        assert!(check_destination(d.path()).is_err());
        let f = d.path().join("f");
        assert!(check_destination(&f).is_ok(), "a new path");
        std::fs::write(&f, b"x").expect("write");
        assert!(check_destination(&f).is_ok(), "a regular file is replaced");
    }
}
