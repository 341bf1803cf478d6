//! The verbs: what each is called and what it does to the files it meets (the engine's work,
//! whether it changes files or writes its own through temp files).

use serde::Serialize;

use crate::engine::Work;

/// The verb a report is about: it decides what is worth a line and what the summary says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verb {
    /// `tag`.
    Tag,
    /// `check`.
    Check,
    /// `update`.
    Update,
    /// `strip`.
    Strip,
    /// `show`.
    Show,
    /// `export`.
    Export,
    /// `import`.
    Import,
    /// `archive create`.
    Archive,
    /// `archive verify`.
    Verify,
    /// `protect`.
    Protect,
    /// `repair`.
    Repair,
    /// `scrub`.
    Scrub,
    /// `status`.
    Status,
    /// `watch`.
    Watch,
}

impl Verb {
    /// The verb's name.
    pub fn name(self) -> &'static str {
        match self {
            Verb::Tag => "tag",
            Verb::Check => "check",
            Verb::Update => "update",
            Verb::Strip => "strip",
            Verb::Show => "show",
            Verb::Export => "export",
            Verb::Import => "import",
            Verb::Archive => "archive",
            Verb::Verify => "verify",
            Verb::Protect => "protect",
            Verb::Repair => "repair",
            Verb::Scrub => "scrub",
            Verb::Status => "status",
            Verb::Watch => "watch",
        }
    }

    /// What the engine does to each file for it (`scrub --update` updates instead).
    pub fn work(self) -> Work {
        match self {
            Verb::Tag => Work::Tag,
            Verb::Check | Verb::Scrub | Verb::Repair | Verb::Verify => Work::Check,
            Verb::Update | Verb::Archive | Verb::Protect | Verb::Watch => Work::Update,
            Verb::Strip => Work::Strip,
            Verb::Show | Verb::Status => Work::Show,
            Verb::Export => Work::Export,
            Verb::Import => Work::Import,
        }
    }

    /// Whether it changes files, and so removes the temp files of killed runs where it
    /// meets them (the others only report them).
    pub fn changes_files(self) -> bool {
        matches!(
            self,
            Verb::Tag
                | Verb::Update
                | Verb::Watch
                | Verb::Strip
                | Verb::Import
                | Verb::Archive
                | Verb::Protect
                | Verb::Repair
        )
    }

    /// Whether it writes files of its own through temp files (an archive, parity, repaired
    /// copies): a second Ctrl-C still waits for them to be cleaned up.
    pub fn writes_temps(self) -> bool {
        matches!(self, Verb::Archive | Verb::Protect | Verb::Repair)
    }
}
