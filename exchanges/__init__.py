"""exchanges."""
