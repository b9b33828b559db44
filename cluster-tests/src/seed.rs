//! The seed of a randomized test: printed, and replayable.

/// `$TRIBUTARY_TEST_SEED` if set and not empty, else a random seed. Printed either way, with
/// how to replay it.
pub fn test_seed(test: &str) -> u64 {
    let text = std::env::var("TRIBUTARY_TEST_SEED").unwrap_or_default();
    let seed = match text.trim() {
        "" => rand::random(),
        text => text
            .parse()
            .unwrap_or_else(|_| panic!("TRIBUTARY_TEST_SEED={text:?} is not a whole number (u64)")),
    };
    eprintln!("{test}: seed {seed} (replay with TRIBUTARY_TEST_SEED={seed})");
    seed
}
