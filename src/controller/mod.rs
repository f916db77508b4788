//! controller
