//! The seed of a randomized test: printed, and replayable.

/// `$TRIBUTARY_TEST_SEED` if set (and not empty), else a random seed. Printed either way, with how to rerun.
pub fn test_seed(test: &str) -> u64 {
    let seed = match std::env::var("TRIBUTARY_TEST_SEED") {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("TRIBUTARY_TEST_SEED={text:?} is not a whole number (u64)")),
        Err(_) => rand::random(),
    };
    eprintln!("{test}: seed {seed} (replay with TRIBUTARY_TEST_SEED={seed})");
    seed
}
