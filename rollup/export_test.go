package rollup

// PeakHoursPerRun is peakHoursPerRun, for the external tests.
const PeakHoursPerRun = peakHoursPerRun

// VersionReplicaBits is versionReplicaBits, for the external tests.
const VersionReplicaBits = versionReplicaBits
