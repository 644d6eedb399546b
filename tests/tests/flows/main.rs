//! Whole flows: the five handlers on the production wiring against the offline emulator
//! (`local-cloud`) and moto's DynamoDB, one test binary so that the IAM test can play every
//! scenario and see every AWS operation each function makes.

mod alarms;
mod basics;
mod deployments;
mod ec2;
mod extensions;
mod iam;
mod notices;
mod payment;
mod sagemaker;
mod windows;

/// Every scenario above, one after another (each is a `#[tokio::test]`, so each builds its
/// own runtime): the IAM test's record of what the functions call.
pub(crate) fn play_all() {
    let scenarios: &[fn()] = &[
        basics::a_request_is_searched_bought_once_and_announced_on_the_bus,
        basics::a_purchase_whose_response_is_lost_is_adopted_not_bought_twice,
        basics::without_listing_lag_a_lost_purchase_response_is_adopted_at_once,
        basics::with_the_documented_payment_pending_first_state_a_block_is_bought_and_tracked_until_scheduled,
        basics::an_invalid_request_is_rejected_on_the_bus_naming_every_field,
        basics::a_bought_block_the_table_no_longer_records_is_announced_by_the_hourly_detector,
        ec2::an_ec2_request_lives_from_submission_to_the_end_of_its_block,
        ec2::a_500_on_the_purchase_is_reconciled_through_the_in_doubt_window_then_bought_once,
        ec2::two_purchase_invocations_at_once_buy_one_block,
        ec2::duplicate_and_early_delivered_events_launch_the_workload_once,
        ec2::a_missed_delivered_event_is_made_up_for_by_the_schedule,
        ec2::an_impaired_instance_is_replaced_in_the_same_block_once_its_slot_returns,
        ec2::a_running_block_is_stopped_early_only_by_a_cancellation_with_stop_running,
        ec2::an_event_lost_between_commit_and_publish_is_published_once_by_the_next_run,
        ec2::on_demand_first_without_on_demand_capacity_falls_back_to_one_reservation,
        ec2::on_demand_capacity_for_only_part_of_the_request_is_released_but_for_what_ran,
        ec2::a_launch_cut_short_after_ec2_started_an_instance_finishes_without_doubling_it,
        ec2::the_reservation_spelling_of_the_delivered_event_launches_too,
        ec2::an_instance_that_stops_unexpectedly_is_replaced_from_its_state_change_events,
        ec2::most_instances_failing_at_once_are_left_alone,
        ec2::a_block_that_never_activates_ends_saying_so_and_fails_nothing,
        ec2::a_16_instance_block_launches_over_several_short_invocations_without_a_duplicate,
        ec2::a_launch_template_with_efa_interfaces_launches_with_every_interface_in_the_blocks_subnet,
        ec2::a_full_subnet_moves_a_blocks_launch_to_the_zones_other_subnet_and_a_full_zone_waits_for_addresses,
        ec2::an_account_vcpu_limit_on_demand_falls_back_to_a_reservation_instead_of_failing,
        ec2::at_the_lenient_readings_a_new_instance_is_watched_and_replaced_at_once,
        ec2::a_block_bought_in_another_region_is_launched_from_its_forwarded_delivered_event,
        sagemaker::a_training_job_runs_on_its_plan_and_is_stopped_before_forced_termination,
        sagemaker::each_segment_of_a_split_plan_gets_its_own_job_launched_and_drained_in_its_own_window,
        sagemaker::an_endpoint_is_created_on_its_active_plan_and_deleted_with_its_config_at_drain,
        sagemaker::an_endpoint_that_fails_is_deleted_waited_out_and_created_again_in_its_window,
        sagemaker::under_the_refusing_reading_an_endpoint_still_waits_for_its_plan,
        sagemaker::an_update_cluster_whose_answer_is_lost_is_settled_by_describing_the_cluster,
        sagemaker::a_managed_hyperpod_cluster_gets_its_instance_group_on_the_plan_and_removed_at_its_last_drain,
        sagemaker::a_hyperpod_request_for_a_cluster_without_the_managed_tag_is_rejected_and_nothing_bought,
        sagemaker::a_shared_cluster_keeps_its_other_group_whole_and_an_update_under_way_is_waited_out,
        sagemaker::at_the_lenient_readings_a_shared_cluster_keeps_its_other_group_whole_too,
        sagemaker::with_current_count_sent_a_request_for_an_existing_group_is_rejected_for_it,
        sagemaker::an_on_demand_training_job_that_fails_for_capacity_falls_back_to_a_plan,
        windows::a_splits_kept_first_block_launches_at_its_own_start_while_a_later_replacement_is_bought,
        windows::a_plan_whose_windows_all_passed_while_cleanup_was_down_is_cleaned_up_and_ended,
        payment::a_block_whose_payment_fails_gives_its_debit_back_and_is_bought_again,
        payment::a_training_plan_that_fails_is_bought_again_under_the_next_name,
        payment::a_failed_payment_seen_after_the_search_deadline_fails_the_request_with_the_money_back,
        deployments::a_second_deployment_in_the_account_neither_sweeps_nor_adopts_the_firsts,
        notices::each_lead_time_notice_goes_on_time_late_or_is_recorded_as_skipped,
        notices::a_lead_whose_moment_came_before_the_purchase_produces_nothing,
        notices::a_teams_filter_policy_receives_only_its_own_notices,
        extensions::a_block_extended_by_hand_drains_before_its_new_end_and_a_stale_warning_drains_nothing,
        extensions::a_plan_extended_by_hand_is_not_drained_at_its_old_end,
        extensions::a_block_extension_the_team_asks_for_is_bought_once_and_moves_the_drain_once_paid,
        extensions::a_plan_extension_the_team_asks_for_is_bought_once_and_moves_the_drain_once_paid,
        extensions::a_block_extension_whose_payment_fails_gives_its_fee_back_and_keeps_the_end,
    ];
    for scenario in scenarios {
        scenario();
    }
}
