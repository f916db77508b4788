//! batch/v1 Job and CronJob (`k8s.io/api/batch/v1/generated.proto`), as `kubectl create job` and
//! `kubectl create cronjob` fill them (`kubectl/pkg/cmd/create/create_job.go`, `create_cronjob.go`;
//! `create job --from=cronjob/x` copies the CronJob's job template and sets an owner reference).

use k8s_pb::api::batch::v1::{CronJob, CronJobSpec, Job, JobSpec, JobTemplateSpec};
use serde_json::Value;

use super::fields::{Obj, Result};
use super::{core, meta};

pub fn job(j: Job) -> Result<Value> {
    let Job {
        metadata,
        spec,
        status,
    } = j;
    let mut o = Obj::new("");
    o.embedded("metadata", metadata, meta::object_meta)?;
    o.embedded("spec", spec, job_spec)?;
    o.unmapped("status", &status)?;
    o.done()
}

fn job_spec(path: &str, s: JobSpec) -> Result<Value> {
    let JobSpec {
        parallelism,
        completions,
        active_deadline_seconds,
        pod_failure_policy,
        success_policy,
        backoff_limit,
        backoff_limit_per_index,
        max_failed_indexes,
        selector,
        manual_selector,
        template,
        ttl_seconds_after_finished,
        completion_mode,
        suspend,
        pod_replacement_policy,
        managed_by,
    } = s;
    let mut o = Obj::new(path);
    o.ptr("parallelism", parallelism);
    o.ptr("completions", completions);
    o.ptr("activeDeadlineSeconds", active_deadline_seconds);
    o.unmapped("podFailurePolicy", &pod_failure_policy)?;
    o.unmapped("successPolicy", &success_policy)?;
    o.ptr("backoffLimit", backoff_limit);
    o.ptr("backoffLimitPerIndex", backoff_limit_per_index);
    o.ptr("maxFailedIndexes", max_failed_indexes);
    o.message("selector", selector, meta::label_selector)?;
    o.ptr("manualSelector", manual_selector);
    o.embedded("template", template, core::pod_template_spec)?;
    o.ptr("ttlSecondsAfterFinished", ttl_seconds_after_finished);
    o.ptr("completionMode", completion_mode);
    o.ptr("suspend", suspend);
    o.ptr("podReplacementPolicy", pod_replacement_policy);
    o.ptr("managedBy", managed_by);
    o.done()
}

pub fn cron_job(c: CronJob) -> Result<Value> {
    let CronJob {
        metadata,
        spec,
        status,
    } = c;
    let mut o = Obj::new("");
    o.embedded("metadata", metadata, meta::object_meta)?;
    o.embedded("spec", spec, cron_job_spec)?;
    o.unmapped("status", &status)?;
    o.done()
}

fn cron_job_spec(path: &str, s: CronJobSpec) -> Result<Value> {
    let CronJobSpec {
        schedule,
        time_zone,
        starting_deadline_seconds,
        concurrency_policy,
        suspend,
        job_template,
        successful_jobs_history_limit,
        failed_jobs_history_limit,
    } = s;
    let mut o = Obj::new(path);
    o.string("schedule", schedule);
    o.ptr("timeZone", time_zone);
    o.ptr("startingDeadlineSeconds", starting_deadline_seconds);
    o.string("concurrencyPolicy", concurrency_policy);
    o.ptr("suspend", suspend);
    o.embedded("jobTemplate", job_template, |path, t: JobTemplateSpec| {
        let JobTemplateSpec { metadata, spec } = t;
        let mut o = Obj::new(path);
        o.embedded("metadata", metadata, meta::object_meta)?;
        o.embedded("spec", spec, job_spec)?;
        o.done()
    })?;
    o.ptr("successfulJobsHistoryLimit", successful_jobs_history_limit);
    o.ptr("failedJobsHistoryLimit", failed_jobs_history_limit);
    o.done()
}
