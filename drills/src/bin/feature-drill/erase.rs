pub async fn run(_s: crate::Setup) -> drills::Result<crate::Outcome> {
    Err(drills::DrillError("not yet".into()))
}
