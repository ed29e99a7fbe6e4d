"""The ground floor: modules every app may import and that import no app."""
