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

    /// What the verb is, decided for each verb here: a new verb does not compile until it is.
    fn facts(self) -> Facts {
        let none = Facts {
            work: Work::Show,
            changes_files: false,
            writes_temps: false,
            judges: false,
            verifies_tags: false,
        };
        match self {
            Verb::Tag => Facts {
                work: Work::Tag,
                changes_files: true,
                ..none
            },
            Verb::Check | Verb::Scrub => Facts {
                work: Work::Check,
                judges: true,
                verifies_tags: true,
                ..none
            },
            Verb::Update => Facts {
                work: Work::Update,
                changes_files: true,
                judges: true,
                ..none
            },
            Verb::Strip => Facts {
                work: Work::Strip,
                changes_files: true,
                ..none
            },
            Verb::Show | Verb::Status => none,
            Verb::Export => Facts {
                work: Work::Export,
                ..none
            },
            Verb::Import => Facts {
                work: Work::Import,
                changes_files: true,
                ..none
            },
            Verb::Archive | Verb::Protect => Facts {
                work: Work::Update,
                changes_files: true,
                writes_temps: true,
                ..none
            },
            Verb::Verify => Facts {
                work: Work::Check,
                verifies_tags: true,
                ..none
            },
            Verb::Repair => Facts {
                work: Work::Check,
                changes_files: true,
                writes_temps: true,
                judges: true,
                verifies_tags: true,
            },
            Verb::Watch => Facts {
                work: Work::Update,
                changes_files: true,
                ..none
            },
        }
    }

    /// What the engine does to each file for it (`scrub --update` updates instead).
    pub fn work(self) -> Work {
        self.facts().work
    }

    /// Whether it changes files, and so removes the temp files of killed runs where it
    /// meets them (the others only report them).
    pub fn changes_files(self) -> bool {
        self.facts().changes_files
    }

    /// Whether it writes files of its own through temp files (an archive, parity, repaired
    /// copies): a second Ctrl-C still waits for them to be cleaned up.
    pub fn writes_temps(self) -> bool {
        self.facts().writes_temps
    }

    /// Whether it judges the files under its roots (check, update, scrub, repair), and so
    /// says what damage earlier runs found that is still there, recorded or not.
    pub fn judges(self) -> bool {
        self.facts().judges
    }

    /// Whether it verifies files against their tags as its job: a malformed tag leaves a
    /// file unverified (trouble), where the verbs that write tags repair it.
    pub fn verifies_tags(self) -> bool {
        self.facts().verifies_tags
    }
}

/// What a verb is (see [`Verb::facts`]).
#[derive(Clone, Copy)]
struct Facts {
    work: Work,
    changes_files: bool,
    writes_temps: bool,
    judges: bool,
    verifies_tags: bool,
}
